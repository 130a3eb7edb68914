//! Prodigy (Mishchenko & Defazio, 2023): Adam whose step size `d` is learnt from the
//! gradients' correlation with the distance travelled from the start, as the reference
//! package `prodigyopt` (1.1) does it, one parameter group. The schedule's learning
//! rate multiplies `d` (leave it at 1, constant, unless training is unstable).

use std::collections::HashMap;

use candle_core::{DType, Tensor, Var};
use serde::{Deserialize, Serialize};

use super::saved::{self, Saved};
use crate::trace;
use crate::{Error, Result};

/// Prodigy's hyper-parameters, with `prodigyopt`'s names and defaults.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProdigyConfig {
    pub beta1: f64,
    pub beta2: f64,
    /// The running averages' rate for the step-size estimate; `None`: `sqrt(beta2)`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub beta3: Option<f64>,
    pub eps: f64,
    pub weight_decay: f64,
    /// AdamW-style (decoupled) weight decay rather than an L2 term in the gradient.
    pub decouple: bool,
    /// Adam's bias correction on the step size.
    pub use_bias_correction: bool,
    /// Leaves the learning rate out of the estimate's denominator (for warm-up).
    pub safeguard_warmup: bool,
    /// The first estimate of `d`.
    pub d0: f64,
    /// Multiplies every estimate of `d`: the way to tune Prodigy (0.5 or 2 also work).
    pub d_coef: f64,
    /// `d` grows by at most this factor a step; `None`: unbounded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub growth_rate: Option<f64>,
}

impl Default for ProdigyConfig {
    fn default() -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.999,
            beta3: None,
            eps: 1e-8,
            weight_decay: 0.0,
            decouple: true,
            use_bias_correction: false,
            safeguard_warmup: false,
            d0: 1e-6,
            d_coef: 1.0,
            growth_rate: None,
        }
    }
}

impl ProdigyConfig {
    pub(super) fn problems(&self) -> Vec<(&'static str, String)> {
        let growth = self.growth_rate.filter(|g| !(g.is_finite() && *g >= 1.0));
        [
            super::beta_problem("beta1", self.beta1),
            super::beta_problem("beta2", self.beta2),
            self.beta3.and_then(|b| super::beta_problem("beta3", b)),
            super::positive_problem("eps", self.eps),
            super::non_negative_problem("weight_decay", self.weight_decay),
            super::positive_problem("d0", self.d0),
            super::positive_problem("d_coef", self.d_coef),
            growth.map(|g| ("growth_rate", format!("{g} must be at least 1 (or left out: unbounded)"))),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    fn beta3(&self) -> f64 {
        self.beta3.unwrap_or(self.beta2.sqrt())
    }
}

/// One parameter's state. `p0` is its value at the first step, or `None` where that
/// was all zeros (the package keeps a scalar 0 then: LoRA's B starts so).
struct ParamState {
    m: Option<Tensor>,
    v: Tensor,
    s: Tensor,
    p0: Option<Tensor>,
}

/// The estimate's running values, kept across steps.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Estimate {
    d: f64,
    d_max: f64,
    d_numerator: f64,
    /// Steps the package counts (`k`): those with some gradient so far.
    k: u64,
}

pub struct Prodigy {
    vars: Vec<Var>,
    config: ProdigyConfig,
    params: Vec<ParamState>,
    estimate: Estimate,
    /// Updates applied (or, before any gradient, attempted): the run's step count.
    steps: u64,
}

fn key(name: &str) -> String {
    format!("prodigy.{name}")
}

fn param_key(name: &str, i: usize) -> String {
    format!("prodigy.{name}.{i}")
}

impl Prodigy {
    pub fn new(vars: Vec<Var>, config: ProdigyConfig) -> Result<Self> {
        let params = vars
            .iter()
            .map(|var| {
                let p = saved::value_f32(var)?;
                let nonzero = trace::read_back("prodigy start", &p.abs()?.sum_all()?)?[0] != 0.0;
                Ok(ParamState {
                    m: (config.beta1 > 0.0).then(|| saved::zeros_like(var)).transpose()?,
                    v: saved::zeros_like(var)?,
                    s: saved::zeros_like(var)?,
                    // A copy in storage of its own: the parameter's changes in place, and
                    // `Tensor::copy` shares its buffer on Metal (candle's `try_clone` there).
                    p0: nonzero.then(|| p.force_contiguous()).transpose()?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let d = config.d0;
        Ok(Self { vars, config, params, estimate: Estimate { d, d_max: d, d_numerator: 0.0, k: 0 }, steps: 0 })
    }

    pub fn from_state(vars: Vec<Var>, config: ProdigyConfig, state: &HashMap<String, Tensor>) -> Result<Self> {
        let saved = Saved(state);
        let params = (vars.iter().enumerate())
            .map(|(i, var)| {
                let p0 = param_key("p0", i);
                Ok(ParamState {
                    m: (config.beta1 > 0.0).then(|| saved.like(&param_key("m", i), var)).transpose()?,
                    v: saved.like(&param_key("v", i), var)?,
                    s: saved.like(&param_key("s", i), var)?,
                    p0: saved.has(&p0).then(|| saved.like(&p0, var)).transpose()?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let estimate = Estimate {
            d: saved.number(&key("d"))?,
            d_max: saved.number(&key("d_max"))?,
            d_numerator: saved.number(&key("d_numerator"))?,
            k: saved.count(&key("k"))?,
        };
        Ok(Self { vars, config, params, estimate, steps: saved.count(&key("step"))? })
    }

    /// `prodigy.{step,k}` (i64), `prodigy.{d,d_max,d_numerator}` (f64) and per
    /// parameter `prodigy.{m,v,s}.<i>` and, where the start was not all zeros,
    /// `prodigy.p0.<i>` (f32).
    pub fn state_tensors(&self) -> Result<Vec<(String, Tensor)>> {
        let e = self.estimate;
        let mut out = vec![
            saved::count(key("step"), self.steps)?,
            saved::count(key("k"), e.k)?,
            saved::number(key("d"), e.d)?,
            saved::number(key("d_max"), e.d_max)?,
            saved::number(key("d_numerator"), e.d_numerator)?,
        ];
        for (i, p) in self.params.iter().enumerate() {
            let named = [("m", p.m.as_ref()), ("v", Some(&p.v)), ("s", Some(&p.s)), ("p0", p.p0.as_ref())];
            out.extend(named.into_iter().filter_map(|(name, t)| Some((param_key(name, i), t?.clone()))));
        }
        Ok(out)
    }

    pub fn step_count(&self) -> u64 {
        self.steps
    }

    /// The current step size estimate `d`.
    pub fn d(&self) -> f64 {
        self.estimate.d
    }

    /// One update; returns the step size taken, `d * lr` (times Adam's bias correction
    /// when on). Until some gradient is non-zero the package changes nothing but the
    /// moments, and neither does this.
    pub fn step(&mut self, grads: &[Tensor], lr: f64) -> Result<f64> {
        if grads.len() != self.vars.len() {
            return Err(Error::GradientCount { params: self.vars.len(), grads: grads.len() });
        }
        self.steps += 1;
        let c = self.config;
        let (beta1, beta2, beta3) = (c.beta1, c.beta2, c.beta3());
        let Estimate { mut d, mut d_max, d_numerator, k } = self.estimate;
        let bias_correction = match c.use_bias_correction {
            true => {
                let k1 = i32::try_from(k + 1).unwrap_or(i32::MAX);
                (1.0 - beta2.powi(k1)).sqrt() / (1.0 - beta1.powi(k1))
            }
            false => 1.0,
        };
        let dlr = d * lr * bias_correction;
        let s_rate = (d / c.d0) * if c.safeguard_warmup { d } else { dlr };

        // 1. Moments, the running sum s, and per tensor the f32 reductions the estimate's
        //    numerator and denominator sum in f64 (the package's `.item()`s), read back
        //    together: on a GPU each read-back is a synchronisation.
        let mut reductions = Vec::with_capacity(2 * grads.len());
        let mut used = Vec::with_capacity(grads.len());
        for ((var, grad), st) in self.vars.iter().zip(grads).zip(&mut self.params) {
            let p = saved::value_f32(var)?;
            let mut g = grad.detach().to_dtype(DType::F32)?;
            if c.weight_decay != 0.0 && !c.decouple {
                g = (g + (&p * c.weight_decay)?)?;
            }
            let travelled = match &st.p0 {
                Some(p0) => (p0 - &p)?,
                None => p.neg()?,
            };
            reductions.push((&g * &travelled)?.sum_all()?);
            if let Some(m) = &st.m {
                st.m = Some(((m * beta1)? + (&g * (d * (1.0 - beta1)))?)?);
            }
            st.v = ((&st.v * beta2)? + (g.sqr()? * (d * d * (1.0 - beta2)))?)?;
            st.s = ((&st.s * beta3)? + (&g * s_rate)?)?;
            reductions.push(st.s.abs()?.sum_all()?);
            used.push((p, g));
        }
        let read = match reductions.is_empty() {
            true => Vec::new(),
            false => trace::read_back("prodigy estimate", &Tensor::stack(&reductions, 0)?)?,
        };
        let (mut delta_numerator, mut d_denom) = (0.0, 0.0);
        for pair in read.chunks_exact(2) {
            delta_numerator += (d / c.d0) * dlr * f64::from(pair[0]);
            d_denom += f64::from(pair[1]);
        }
        if d_denom == 0.0 {
            return Ok(dlr);
        }

        // 2. The new estimate: d only grows, at most by growth_rate a step.
        let numerator = d_numerator * beta3 + delta_numerator;
        if lr > 0.0 {
            let d_hat = c.d_coef * numerator / d_denom;
            if d == c.d0 {
                d = d.max(d_hat);
            }
            d_max = d_max.max(d_hat);
            d = d_max.min(d * c.growth_rate.unwrap_or(f64::INFINITY));
        }
        self.estimate = Estimate { d, d_max, d_numerator: numerator, k: k + 1 };

        // 3. The Adam step with the old step size over the new d's denominator.
        for ((var, (p, g)), st) in self.vars.iter().zip(used).zip(&self.params) {
            let denom = st.v.sqrt()?.affine(1.0, d * c.eps)?;
            let mut p = p;
            if c.weight_decay != 0.0 && c.decouple {
                p = (&p - (&p * (c.weight_decay * dlr))?)?;
            }
            let p = match &st.m {
                Some(m) => (p - (m.div(&denom)? * dlr)?)?,
                None => (p - (g.div(&denom)? * (dlr * d))?)?,
            };
            saved::set(var, &p)?;
        }
        Ok(dlr)
    }
}
