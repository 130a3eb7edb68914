//! The SwiGLU MLP, `down(silu(gate(x)) * up(x))`, with frozen weights.
//!
//! On the CPU with f32 it is one graph node that keeps `gate(x)` and `up(x)` for the
//! backward and nothing else (composed, the graph also holds `silu(gate) * up`, and the
//! backward holds four more `[rows, intermediate]` gradients plus candle's zeros for
//! each). The backward runs in row blocks: the `[rows, intermediate]` gradients exist
//! one block at a time, and it releases `gate(x)` and `up(x)` when done: the graph
//! lives until the whole backward returns, so otherwise they would sit beside the
//! layer's attention backwards, which run after the MLP's. Same GEMMs as the composed
//! form, no recompute. With a LoRA on an MLP projection, or on other devices, the
//! composed form runs.
//!
//! Gradient checkpointing's recompute ends each layer with `gated_residual_root`: the
//! same node's backward, without the down projection's forward.

use std::sync::Mutex;

use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Error, Layout, Result, Shape, Tensor};

use super::ops;
use super::policy::KernelPolicy;
use crate::kernels::cpu_gemm::{host_f32, matmul_into, Mat, Threads};
use crate::kernels::handover::{on_cpu, Handover};
use crate::trace;

/// Rows per block of the backward: `[block, intermediate]` f32 gradients are 6 MiB
/// each at ACE-Step's 6144 (1.5 MiB at the bench's 1536).
const BACKWARD_ROWS: usize = 256;

pub fn swiglu_mlp(k: KernelPolicy, x: &Tensor, gate: &Tensor, up: &Tensor, down: &Tensor) -> Result<Tensor> {
    let composed = |x: &Tensor| -> Result<Tensor> {
        let h = ops::swiglu(k, &ops::linear(x, gate, None)?, &ops::linear(x, up, None)?)?;
        ops::linear(&h, down, None)
    };
    if !fusable(k, x, [gate, up, down]) {
        return composed(x);
    }
    let kept = Kept::forward(k, x, [gate, up, down])?;
    let out = ops::linear(&kept.swiglu()?, down, None)?;
    if !x.track_op() {
        return Ok(out);
    }
    x.apply_op1(MlpNode { out: Handover::new(out, "swiglu-mlp"), kept })
}

/// The backward of the gated residual `x + mlp(h) * gate` from its output's gradient
/// `grad_out`, as a root (see `roots`): its backward hands `x` the gradient `grad_out`
/// and `h` the MLP's input gradient for `grad_out * gate`. For gradient checkpointing's
/// recompute: the down projection, the residual's last op, never runs forward, as the
/// backward needs its input but not its output. `None` where the MLP runs composed or
/// the gate is tracked (its gradient would need that output).
pub fn gated_residual_root(
    k: KernelPolicy,
    x: &Tensor,
    h: &Tensor,
    gate: &Tensor,
    weights: [&Tensor; 3],
    grad_out: &Tensor,
) -> Result<Option<Tensor>> {
    if !fusable(k, h, weights) || gate.track_op() || gate.dtype() != DType::F32 {
        return Ok(None);
    }
    let kept = Kept::forward(k, h, weights)?;
    let root = ResidualRoot { kept, gate: gate.clone(), grad_out: grad_out.clone() };
    Ok(Some(x.apply_op2(h, root)?))
}

/// Whether the MLP over `x` runs as one node: on the CPU kernels, weights frozen.
fn fusable(k: KernelPolicy, x: &Tensor, weights: [&Tensor; 3]) -> bool {
    k.on_host(x) && weights.iter().all(|w| w.dtype() == DType::F32 && !w.track_op())
}

/// What the MLP's backward needs: `gate(x)` and `up(x)`, taken by the backward (which
/// runs once per graph), and the weights gate `[I, H]`, up `[I, H]`, down `[H, I]`.
struct Kept {
    gate_up: Mutex<Option<(Tensor, Tensor)>>,
    weights: [Tensor; 3],
    k: KernelPolicy,
}

impl Kept {
    /// `gate(x)` and `up(x)`, without a graph.
    fn forward(k: KernelPolicy, x: &Tensor, weights: [&Tensor; 3]) -> Result<Self> {
        let xd = x.detach();
        let g = ops::linear(&xd, weights[0], None)?;
        let u = ops::linear(&xd, weights[1], None)?;
        Ok(Self { gate_up: Mutex::new(Some((g, u))), weights: weights.map(Tensor::clone), k })
    }

    /// The down projection's input `silu(gate(x)) * up(x)` (the forward's, before the
    /// backward takes what is kept).
    fn swiglu(&self) -> Result<Tensor> {
        let kept = self.gate_up.lock().expect("mlp lock");
        let (g, u) = kept.as_ref().ok_or_else(|| Error::Msg("swiglu-mlp: its backward already ran".into()))?;
        ops::swiglu(self.k, g, u)
    }

    /// The gradient for the MLP's input `x` from its output's gradient `grad`.
    fn input_grad(&self, x: &Tensor, grad: &Tensor) -> Result<Tensor> {
        let [w_gate, w_up, w_down] = &self.weights;
        let hidden = x.dim(candle_core::D::Minus1)?;
        let rows = x.elem_count() / hidden;
        let inter = w_gate.dim(0)?;
        let grad = grad.reshape((rows, hidden))?;
        let kept = self.gate_up.lock().expect("mlp lock").take();
        let (g, u) = kept.ok_or_else(|| Error::Msg("swiglu-mlp: backward ran twice over one graph".into()))?;
        let (g, u) = (g.reshape((rows, inter))?, u.reshape((rows, inter))?);
        // dx = d_gate w_gate + d_up w_up, both GEMMs writing the block's rows in place.
        let mut dx = vec![0f32; rows * hidden];
        let (wg, wg_layout) = w_gate.storage_and_layout();
        let (wu, wu_layout) = w_up.storage_and_layout();
        const OP: &str = "swiglu-mlp";
        let (wg, wu) = (Mat::of(host_f32(&wg, OP)?, wg_layout, 0), Mat::of(host_f32(&wu, OP)?, wu_layout, 0));
        for start in (0..rows).step_by(BACKWARD_ROWS) {
            let n = BACKWARD_ROWS.min(rows - start);
            let (gb, ub) = (g.narrow(0, start, n)?, u.narrow(0, start, n)?);
            let d_h = trace::matmul(&grad.narrow(0, start, n)?, w_down)?; // [n, I]
            let d_gate = ops::swiglu_grad(self.k, &gb, &ub, &d_h, true)?;
            let d_up = ops::swiglu_grad(self.k, &gb, &ub, &d_h, false)?;
            let (dg, dg_layout) = d_gate.storage_and_layout();
            let (du, du_layout) = d_up.storage_and_layout();
            let (dg, du) = (Mat::of(host_f32(&dg, OP)?, dg_layout, 0), Mat::of(host_f32(&du, OP)?, du_layout, 0));
            matmul_into(&mut dx, start * hidden, hidden, dg, wg, false, Threads::Pool);
            matmul_into(&mut dx, start * hidden, hidden, du, wu, true, Threads::Pool);
        }
        Tensor::from_vec(dx, x.shape(), x.device())
    }
}

/// Attaches the MLP's backward to `x`; the forward was computed without a graph.
struct MlpNode {
    /// The forward's result, computed without a graph.
    out: Handover,
    kept: Kept,
}

impl CustomOp1 for MlpNode {
    fn name(&self) -> &'static str {
        "swiglu-mlp"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        self.kept.k.cpu_only(self.name())?;
        self.out.take(on_cpu)
    }

    fn bwd(&self, x: &Tensor, _y: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(self.kept.input_grad(x, grad)?))
    }
}

/// The root of `gated_residual_root` over `(x, h)`.
struct ResidualRoot {
    kept: Kept,
    gate: Tensor,
    grad_out: Tensor,
}

impl CustomOp2 for ResidualRoot {
    fn name(&self) -> &'static str {
        "gated-residual-root"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        self.kept.k.cpu_only(self.name())?;
        Ok((CpuStorage::F32(Vec::new()), Shape::from(0)))
    }

    fn bwd(&self, x: &Tensor, h: &Tensor, _y: &Tensor, _grad: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let dx = x.track_op().then(|| self.grad_out.clone());
        let dh = match h.track_op() {
            // The same multiply as the fused gated add's backward: bit-identical gradients.
            true => Some(self.kept.input_grad(h, &self.grad_out.broadcast_mul(&self.gate)?)?),
            false => None,
        };
        Ok((dx, dh))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::roots;
    use candle_core::{Device, Var};

    const CPU: KernelPolicy = KernelPolicy::cpu();

    #[test]
    fn matches_the_composed_form() -> Result<()> {
        let dev = Device::Cpu;
        // 600 rows: two full backward blocks and a partial one.
        let x = Var::randn(0f32, 1., (2, 300, 24), &dev)?;
        let (wg, wu) = (Tensor::randn(0f32, 0.3, (40, 24), &dev)?, Tensor::randn(0f32, 0.3, (40, 24), &dev)?);
        let wd = Tensor::randn(0f32, 0.3, (24, 40), &dev)?;
        let g = Tensor::randn(0f32, 1., (2, 300, 24), &dev)?;
        let fused = swiglu_mlp(CPU, x.as_tensor(), &wg, &wu, &wd)?;
        let composed = ops::linear(
            &ops::swiglu(CPU, &ops::linear(x.as_tensor(), &wg, None)?, &ops::linear(x.as_tensor(), &wu, None)?)?,
            &wd,
            None,
        )?;
        let out_err = ops::rel_err(&fused, &composed);
        let gf = (&fused * &g)?.sum_all()?.backward()?;
        let gc = (&composed * &g)?.sum_all()?.backward()?;
        let (dxf, dxc) = (gf.get(&x).unwrap(), gc.get(&x).unwrap());
        let grad_err = ops::rel_err(dxf, dxc);
        println!("swiglu_mlp: output rel err {out_err:.2e}, dx rel err {grad_err:.2e}");
        assert!(out_err == 0.0, "same GEMMs and kernels as the composed forward");
        assert!(grad_err < 1e-5);
        Ok(())
    }

    #[test]
    fn the_residual_root_gives_the_forward_graphs_gradients() -> Result<()> {
        let dev = Device::Cpu;
        let (x, h) = (Var::randn(0f32, 1., (2, 300, 24), &dev)?, Var::randn(0f32, 1., (2, 300, 24), &dev)?);
        let w = |shape: &[usize]| Tensor::randn(0f32, 0.3, shape, &dev);
        let (wg, wu, wd) = (w(&[40, 24])?, w(&[40, 24])?, w(&[24, 40])?);
        let (gate, grad_out) = (w(&[2, 1, 24])?, w(&[2, 300, 24])?);
        let mlp = swiglu_mlp(CPU, h.as_tensor(), &wg, &wu, &wd)?;
        let full = roots::seeded(&ops::gated_add(CPU, x.as_tensor(), &mlp, &gate)?, &grad_out)?.backward()?;
        let root = gated_residual_root(CPU, x.as_tensor(), h.as_tensor(), &gate, [&wg, &wu, &wd], &grad_out)?;
        let root = root.expect("f32 on the CPU with frozen weights: the fused root").backward()?;
        for (name, v) in [("x", &x), ("h", &h)] {
            let err = ops::max_abs(&(full.get(v).unwrap() - root.get(v).unwrap())?);
            println!("gated residual root: {name} gradient difference {err:.1e}");
            assert_eq!(err, 0.0, "{name}: same kernels as the forward graph's backward");
        }
        Ok(())
    }

    #[test]
    fn backward_releases_what_it_kept() -> Result<()> {
        let dev = Device::Cpu;
        let x = Var::randn(0f32, 1., (1, 8, 4), &dev)?;
        let w = |shape| Tensor::randn(0f32, 0.3, shape, &dev);
        let y = swiglu_mlp(CPU, x.as_tensor(), &w((6, 4))?, &w((6, 4))?, &w((4, 6))?)?.sum_all()?;
        y.backward()?;
        let again = y.backward().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(again.contains("backward ran twice"), "a second backward over the graph: {again:?}");
        Ok(())
    }

    /// Built under the GPU policy, the MLP's nodes err in their forwards, naming themselves.
    #[test]
    fn mlp_nodes_err_under_the_gpu_policy() -> Result<()> {
        let (k, dev) = (KernelPolicy::gpu(), Device::Cpu);
        let x = Tensor::randn(0f32, 1., (1, 3, 4), &dev)?;
        let w = |shape| Tensor::randn(0f32, 0.3, shape, &dev);
        let weights = [w((6, 4))?, w((6, 4))?, w((4, 6))?];
        let kept = || Kept::forward(k, &x, [&weights[0], &weights[1], &weights[2]]);
        let node = MlpNode { out: Handover::new(x.clone(), "swiglu-mlp"), kept: kept()? };
        let gate = Tensor::randn(0f32, 0.3, (1, 1, 4), &dev)?;
        let root = ResidualRoot { kept: kept()?, gate, grad_out: x.clone() };
        let runs = [("swiglu-mlp", x.apply_op1_no_bwd(&node)), ("gated-residual-root", x.apply_op2_no_bwd(&x, &root))];
        for (name, run) in runs {
            let err = run.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains(name) && err.contains("no Metal or CUDA forward"), "{name}: {err:?}");
        }
        Ok(())
    }
}
