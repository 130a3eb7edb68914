//! Adafactor (Shazeer & Stern, 2018) as transformers' `Adafactor` does it, with the
//! learning rate from the run's schedule (`relative_step=False`): the second moment of
//! a matrix kept factored as a row and a column average, updates clipped by their
//! RMS, no first moment unless `beta1` is set.

use std::collections::HashMap;

use candle_core::{DType, Tensor, Var, D};
use serde::{Deserialize, Serialize};

use super::saved::{self, Saved};
use crate::{Error, Result};

/// Adafactor's hyper-parameters, with transformers' names and defaults, except
/// `scale_parameter`, off as the LoRA trainers run it with a given learning rate.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdafactorConfig {
    /// Added to the squared gradient (transformers' `eps[0]`).
    pub eps1: f64,
    /// The smallest parameter scale, with `scale_parameter` (`eps[1]`).
    pub eps2: f64,
    /// Updates whose RMS is above this are scaled down to it.
    pub clip_threshold: f64,
    /// The second moment's decay: `beta2` at step t is `1 - t^decay_rate`.
    pub decay_rate: f64,
    /// The first moment's rate; `None`: no first moment (Adafactor's memory saving).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub beta1: Option<f64>,
    pub weight_decay: f64,
    /// Scale each tensor's step by its RMS (at least `eps2`).
    pub scale_parameter: bool,
}

impl Default for AdafactorConfig {
    fn default() -> Self {
        Self {
            eps1: 1e-30,
            eps2: 1e-3,
            clip_threshold: 1.0,
            decay_rate: -0.8,
            beta1: None,
            weight_decay: 0.0,
            scale_parameter: false,
        }
    }
}

impl AdafactorConfig {
    pub(super) fn problems(&self) -> Vec<(&'static str, String)> {
        let decay = self.decay_rate;
        [
            super::positive_problem("eps1", self.eps1),
            super::non_negative_problem("eps2", self.eps2),
            super::positive_problem("clip_threshold", self.clip_threshold),
            (!(decay.is_finite() && decay < 0.0)).then(|| ("decay_rate", format!("{decay} must be below 0"))),
            self.beta1.and_then(|b| super::beta_problem("beta1", b)),
            super::non_negative_problem("weight_decay", self.weight_decay),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// The second moment: factored for matrices (and higher), whole for vectors.
enum SecondMoment {
    /// Averages over the last dimension (shape `dims[..-1]`) and over the one before
    /// it (`dims[..-2] + dims[-1]`).
    Factored {
        row: Tensor,
        col: Tensor,
    },
    Full(Tensor),
}

struct ParamState {
    second: SecondMoment,
    m: Option<Tensor>,
}

pub struct Adafactor {
    vars: Vec<Var>,
    config: AdafactorConfig,
    params: Vec<ParamState>,
    step: u64,
}

const STEP_KEY: &str = "adafactor.step";

fn param_key(name: &str, i: usize) -> String {
    format!("adafactor.{name}.{i}")
}

/// The factored moments' shapes for a parameter of `dims`, or `None` for a vector.
fn factored_dims(dims: &[usize]) -> Option<(Vec<usize>, Vec<usize>)> {
    let n = dims.len();
    (n >= 2).then(|| (dims[..n - 1].to_vec(), [&dims[..n - 2], &dims[n - 1..]].concat()))
}

impl Adafactor {
    pub fn new(vars: Vec<Var>, config: AdafactorConfig) -> Result<Self> {
        let params = vars
            .iter()
            .map(|var| {
                let zeros = |dims: &[usize]| Tensor::zeros(dims, DType::F32, var.device());
                let second = match factored_dims(var.dims()) {
                    Some((row, col)) => SecondMoment::Factored { row: zeros(&row)?, col: zeros(&col)? },
                    None => SecondMoment::Full(saved::zeros_like(var)?),
                };
                Ok(ParamState { second, m: config.beta1.map(|_| saved::zeros_like(var)).transpose()? })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { vars, config, params, step: 0 })
    }

    pub fn from_state(vars: Vec<Var>, config: AdafactorConfig, state: &HashMap<String, Tensor>) -> Result<Self> {
        let saved = Saved(state);
        let params = (vars.iter().enumerate())
            .map(|(i, var)| {
                let second = match factored_dims(var.dims()) {
                    Some((row, col)) => SecondMoment::Factored {
                        row: saved.tensor(&param_key("row", i), &row, var.device())?,
                        col: saved.tensor(&param_key("col", i), &col, var.device())?,
                    },
                    None => SecondMoment::Full(saved.like(&param_key("v", i), var)?),
                };
                let m = config.beta1.map(|_| saved.like(&param_key("m", i), var)).transpose()?;
                Ok(ParamState { second, m })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { vars, config, params, step: saved.count(STEP_KEY)? })
    }

    /// `adafactor.step` (i64) and per parameter `adafactor.{row,col}.<i>` (matrices) or
    /// `adafactor.v.<i>` (vectors), and `adafactor.m.<i>` with a first moment (f32).
    pub fn state_tensors(&self) -> Result<Vec<(String, Tensor)>> {
        let mut out = vec![saved::count(STEP_KEY, self.step)?];
        for (i, p) in self.params.iter().enumerate() {
            match &p.second {
                SecondMoment::Factored { row, col } => {
                    out.push((param_key("row", i), row.clone()));
                    out.push((param_key("col", i), col.clone()));
                }
                SecondMoment::Full(v) => out.push((param_key("v", i), v.clone())),
            }
            if let Some(m) = &p.m {
                out.push((param_key("m", i), m.clone()));
            }
        }
        Ok(out)
    }

    pub fn step_count(&self) -> u64 {
        self.step
    }

    pub fn step(&mut self, grads: &[Tensor], lr: f64) -> Result<()> {
        if grads.len() != self.vars.len() {
            return Err(Error::GradientCount { params: self.vars.len(), grads: grads.len() });
        }
        self.step += 1;
        let c = self.config;
        let beta2 = 1.0 - (self.step as f64).powf(c.decay_rate);
        for ((var, grad), st) in self.vars.iter().zip(grads).zip(&mut self.params) {
            let g = grad.detach().to_dtype(DType::F32)?;
            let p = saved::value_f32(var)?;
            // The step size, a one-element tensor: scaled by the parameter's RMS
            // (computed on the device, read back by nothing).
            let lr = match c.scale_parameter {
                true => (rms(&p)?.maximum(c.eps2)? * lr)?,
                false => Tensor::new(&[lr as f32], p.device())?,
            };
            let squared = (g.sqr()? + c.eps1)?;
            let update = match &mut st.second {
                SecondMoment::Factored { row, col } => {
                    *row = ((&*row * beta2)? + (squared.mean(D::Minus1)? * (1.0 - beta2))?)?;
                    *col = ((&*col * beta2)? + (squared.mean(D::Minus2)? * (1.0 - beta2))?)?;
                    let r = row.broadcast_div(&row.mean_keepdim(D::Minus1)?)?.sqrt()?.recip()?.unsqueeze(D::Minus1)?;
                    let k = col.unsqueeze(col.rank() - 1)?.sqrt()?.recip()?;
                    r.broadcast_mul(&k)?.mul(&g)?
                }
                SecondMoment::Full(v) => {
                    *v = ((&*v * beta2)? + (squared * (1.0 - beta2))?)?;
                    v.sqrt()?.recip()?.mul(&g)?
                }
            };
            let clip = (rms(&update)? / c.clip_threshold)?.maximum(1.0)?;
            let mut update = update.broadcast_div(&clip)?.broadcast_mul(&lr)?;
            if let (Some(beta1), Some(m)) = (c.beta1, &mut st.m) {
                *m = ((&*m * beta1)? + (update * (1.0 - beta1))?)?;
                update = m.clone();
            }
            let mut p = p;
            if c.weight_decay != 0.0 {
                p = (&p - p.broadcast_mul(&(&lr * c.weight_decay)?)?)?;
            }
            saved::set(var, &(p - update)?)?;
        }
        Ok(())
    }
}

/// Root mean square of all elements, as a one-element tensor.
fn rms(t: &Tensor) -> Result<Tensor> {
    Ok(t.sqr()?.mean_all()?.sqrt()?.reshape(1)?)
}
