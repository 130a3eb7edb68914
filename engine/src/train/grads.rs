//! Loss and LoRA gradients for one batch, by the plain path (one graph over the whole
//! forward) or by gradient checkpointing (block recompute). Both give the same
//! gradients; between its passes checkpointing keeps only each block's input and, on
//! full-attention layers, the attention's output.

use std::collections::HashMap;

use candle_core::{Tensor, TensorId, Var};

use super::flow::{FlowBatch, LossReadout};
use crate::lora::{LoraAdapter, LoraMode};
use crate::model::attention::KeptOutput;
use crate::model::DitModel;
use crate::Result;

/// The outcome of forward + backward on one batch.
pub struct Gradients {
    /// The unscaled loss and each sample's, on the device until the step reads them.
    pub loss: LossReadout,
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
    let run = || {
        let vars = adapter.vars();
        if checkpointing {
            checkpointed(model, adapter, batch, mode, loss_scale, &vars)
        } else {
            plain(model, adapter, batch, mode, loss_scale, &vars)
        }
    };
    // On the CPU the step runs on one of rayon's threads, which then takes a share of
    // every parallel GEMM and row op: otherwise the calling thread sleeps through each
    // one and is woken after it, two thread switches per op.
    match model.device().is_cpu() && rayon::current_thread_index().is_none() {
        true => rayon::scope(|_| run()),
        false => run(),
    }
}

/// One graph over the whole forward.
fn plain(
    model: &DitModel,
    adapter: &LoraAdapter,
    batch: &FlowBatch,
    mode: LoraMode,
    loss_scale: f64,
    vars: &[Var],
) -> Result<Gradients> {
    let ctx = adapter.ctx(mode, true);
    let loss = batch.loss(&model.forward(&batch.inputs, Some(&ctx))?)?;
    let store = (&loss.mean * loss_scale)?.backward()?;
    let mut acc = Accumulator::new(vars);
    acc.add(vars, &store)?;
    Ok(Gradients { loss: loss.readout, grads: acc.finish(vars)? })
}

/// Block recompute: forward every block without a graph, keeping each one's input and
/// its full self-attention's output (the costliest part to recompute at long lengths,
/// `attention::KeptOutput`); head and loss run on a copy of the last block's output,
/// for the gradient that output receives. Then, from the last block down: recompute
/// the block from its input made a tracked leaf, as far as its backward needs
/// (`DitLayer::backward_root`), and backpropagate that gradient through it, which
/// yields the block's LoRA gradients and the gradient for its input.
///
/// Keeping the last block's graph from the forward would save its recompute (1/8 of
/// checkpointing's extra time at 8 layers) but raise the peak: the head's backward
/// (~42 MiB at small-240s) would then run beside a block's graph.
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

    // 1. Forward without a graph; keep each block's input (and its full attention's
    //    output).
    let kept: Vec<KeptOutput> = model.layers().iter().map(|_| KeptOutput::default()).collect();
    let mut inputs = Vec::with_capacity(model.layers().len());
    let mut x = prep.hidden.clone();
    for (i, kept) in kept.iter().enumerate() {
        let next = model.layer(i)?.forward_keeping(&x, &prep.layer_ctx, Some(&untracked), Some(kept))?;
        inputs.push(std::mem::replace(&mut x, next));
    }

    // 2. Head and loss on a copy of the last block's output. Only the loss's value is
    //    kept: its graph holds the head's activations.
    let head_in = Var::from_tensor(&x)?;
    drop(x);
    let loss_graph = batch.loss(&model.head(head_in.as_tensor(), &prep)?)?;
    let store = (&loss_graph.mean * loss_scale)?.backward()?;
    let mut grad_out = store.get(&head_in).expect("head input is on the graph").clone();
    let loss = loss_graph.readout;
    drop((store, head_in, loss_graph.mean));

    // 3. Block by block from the last: recompute, backpropagate.
    let mut acc = Accumulator::new(vars);
    for i in (0..model.layers().len()).rev() {
        let (x_in, leaf) = tracked_input(inputs.pop().expect("one saved input per block"), i)?;
        let layer = model.layer(i)?;
        let store = layer.backward_root(&x_in, &prep.layer_ctx, Some(&tracked), &grad_out, &kept[i])?.backward()?;
        acc.add(vars, &store)?;
        if let Some(leaf) = leaf {
            grad_out = store.get(&leaf).expect("block input is on the graph").clone();
        }
    }
    Ok(Gradients { loss, grads: acc.finish(vars)? })
}

/// Block `index`'s input for a tracked forward: a leaf whose gradient is read back (a
/// copy; the saved input is dropped), except block 0's, the patch embedding, whose
/// gradient nothing upstream needs.
fn tracked_input(input: Tensor, index: usize) -> Result<(Tensor, Option<Var>)> {
    if index == 0 {
        return Ok((input, None));
    }
    let leaf = Var::from_tensor(&input)?;
    drop(input);
    Ok((leaf.as_tensor().clone(), Some(leaf)))
}

/// Sums gradients per variable across backward passes.
struct Accumulator {
    index: HashMap<TensorId, usize>,
    sums: Vec<Option<Tensor>>,
}

impl Accumulator {
    fn new(vars: &[Var]) -> Self {
        Self { index: vars.iter().enumerate().map(|(i, v)| (v.id(), i)).collect(), sums: vec![None; vars.len()] }
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
