//! Loss and LoRA gradients for one batch, by the plain path (one graph over the whole
//! forward) or by gradient checkpointing (block recompute). Both give the same
//! gradients; checkpointing keeps only each block's input alive.

use std::collections::HashMap;

use candle_core::{Tensor, TensorId, Var};

use super::flow::FlowBatch;
use crate::lora::{LoraAdapter, LoraMode};
use crate::model::{ops, DitModel};
use crate::Result;

/// The outcome of forward + backward on one batch.
pub struct Gradients {
    /// The unscaled loss (f32).
    pub loss: f32,
    /// One detached f32 gradient per `LoraAdapter::vars()` entry, in that order,
    /// multiplied by the loss scale.
    pub grads: Vec<Tensor>,
}

/// Forward, loss (times `loss_scale`), backward.
pub fn compute(
    model: &DitModel,
    adapter: &LoraAdapter,
    batch: &FlowBatch,
    mode: LoraMode,
    checkpointing: bool,
    loss_scale: f64,
) -> Result<Gradients> {
    let vars = adapter.vars();
    if checkpointing {
        checkpointed(model, adapter, batch, mode, loss_scale, &vars)
    } else {
        let ctx = adapter.ctx(mode, true);
        let loss = batch.loss(&model.forward(&batch.inputs, Some(&ctx))?)?;
        let store = (&loss * loss_scale)?.backward()?;
        let mut acc = Accumulator::new(&vars);
        acc.add(&vars, &store)?;
        Ok(Gradients {
            loss: loss.to_scalar::<f32>()?,
            grads: acc.finish(&vars)?,
        })
    }
}

/// Block recompute: forward every layer without a graph keeping its input; then,
/// from the last layer down, recompute the layer from its input made a tracked leaf
/// and backpropagate the surrogate sum(out * grad_out), which yields the layer's LoRA
/// gradients and the gradient for its input.
fn checkpointed(
    model: &DitModel,
    adapter: &LoraAdapter,
    batch: &FlowBatch,
    mode: LoraMode,
    loss_scale: f64,
    vars: &[Var],
) -> Result<Gradients> {
    let prep = model.prepare(&batch.inputs)?;
    let untracked = adapter.ctx(mode, false);
    let tracked = adapter.ctx(mode, true);

    // 1. Forward without a graph; keep each block's input.
    let mut inputs = Vec::with_capacity(model.layers().len());
    let mut x = prep.hidden.clone();
    for layer in model.layers() {
        let next = layer.forward(&x, &prep.layer_ctx, Some(&untracked))?;
        inputs.push(std::mem::replace(&mut x, next));
    }

    // 2. Head and loss with a graph from the last block's output.
    let last = Var::from_tensor(&x)?;
    let loss = batch.loss(&model.head(last.as_tensor(), &prep)?)?;
    let store = (&loss * loss_scale)?.backward()?;
    let mut grad_out = store.get(&last).expect("head output reaches the loss").clone();
    drop(store);

    // 3. Block by block from the last: recompute, backpropagate the surrogate.
    let mut acc = Accumulator::new(vars);
    for (i, layer) in model.layers().iter().enumerate().rev() {
        let input = inputs.pop().expect("one saved input per layer");
        // Layer 0's input is the patch embedding: nothing upstream needs its gradient.
        let leaf = if i > 0 { Some(Var::from_tensor(&input)?) } else { None };
        let x_in = leaf.as_ref().map_or(&input, |v| v.as_tensor());
        let out = layer.forward(x_in, &prep.layer_ctx, Some(&tracked))?;
        let store = ops::mul(&out, &grad_out)?.sum_all()?.backward()?;
        acc.add(vars, &store)?;
        if let Some(leaf) = leaf {
            grad_out = store.get(&leaf).expect("block input is on the graph").clone();
        }
    }
    Ok(Gradients {
        loss: loss.to_scalar::<f32>()?,
        grads: acc.finish(vars)?,
    })
}

/// Sums gradients per variable across backward passes.
struct Accumulator {
    index: HashMap<TensorId, usize>,
    sums: Vec<Option<Tensor>>,
}

impl Accumulator {
    fn new(vars: &[Var]) -> Self {
        Self {
            index: vars.iter().enumerate().map(|(i, v)| (v.id(), i)).collect(),
            sums: vec![None; vars.len()],
        }
    }

    fn add(&mut self, vars: &[Var], store: &candle_core::backprop::GradStore) -> Result<()> {
        for v in vars {
            if let Some(g) = store.get(v) {
                let slot = &mut self.sums[self.index[&v.id()]];
                *slot = Some(match slot.take() {
                    Some(sum) => (sum + g)?,
                    None => g.detach(),
                });
            }
        }
        Ok(())
    }

    /// Variables no path reached get a zero gradient.
    fn finish(self, vars: &[Var]) -> Result<Vec<Tensor>> {
        self.sums
            .into_iter()
            .zip(vars)
            .map(|(g, v)| match g {
                Some(g) => Ok(g),
                None => Ok(v.as_tensor().zeros_like()?),
            })
            .collect()
    }
}
