use super::*;
use candle_core::Var;

const CPU: KernelPolicy = KernelPolicy::cpu();

fn max_abs(a: &Tensor, b: &Tensor) -> f32 {
    (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap()
}

/// The recompute path's CPU kernels against its candle-op forms (the path other
/// devices take), forward and q/k/v gradients, on banded and full blocks.
#[test]
fn host_kernels_match_the_candle_op_forms() -> Result<()> {
    let dev = Device::Cpu;
    let (b, kv, rep, p, d) = (2, 2, 3, 50, 8);
    let rand = |shape: (usize, usize, usize, usize)| Tensor::randn(0f32, 1.0, shape, &dev);
    let (q, g) = (rand((b, kv, p * rep, d))?, rand((b, kv, p * rep, d))?);
    let (k, v) = (rand((b, kv, p, d))?, rand((b, kv, p, d))?);
    let SlidingPlan::Banded(banded) = SlidingPlan::banded(p, 9, 7, &dev)? else { panic!("a banded plan") };
    let full = (0..p).step_by(16).map(|q_start| BandBlock {
        q_start,
        q_len: 16.min(p - q_start),
        k_start: 0,
        k_len: p,
        mask: None,
    });
    for (what, blocks) in [("banded", banded), ("full", full.collect())] {
        let (out, lse) = attention_host::forward(&q, &k, &v, rep, &blocks)?;
        let composed = blocked_forward(CPU, &q, &k, &v, rep, &blocks)?;
        let out_err = max_abs(&out, &composed);
        let host = attention_host::backward(&q, &k, &v, &out, &lse, &g, rep, &blocks)?;
        let composed = composed_backward(CPU, &q, &k, &v, &g, rep, &blocks)?;
        let grad_err =
            max_abs(&host.0, &composed.0).max(max_abs(&host.1, &composed.1)).max(max_abs(&host.2, &composed.2));
        println!("{what} blocks: host vs candle ops, output {out_err:e}, gradients {grad_err:e} (max abs)");
        assert!(out_err <= 1e-5 && grad_err <= 1e-4, "{what}: {out_err:e} {grad_err:e}");
    }
    Ok(())
}

/// Banded blocks give the masked full square's output within 1e-5 and its q/k/v
/// gradients within 1e-5 relative, for block sizes that do and do not divide P and windows near P.
#[test]
fn banded_equals_masked_full_square() -> Result<()> {
    let dev = Device::Cpu;
    let (b, kv, rep, d) = (2, 2, 3, 16);
    for (p, window, block) in [(97, 8, 4), (97, 8, 13), (64, 16, 8), (40, 30, 7), (200, 32, 16)] {
        let q = Var::randn(0f32, 1.0, (b, kv, p * rep, d), &dev)?;
        let k = Var::randn(0f32, 1.0, (b, kv, p, d), &dev)?;
        let v = Var::randn(0f32, 1.0, (b, kv, p, d), &dev)?;
        let g = Tensor::randn(0f32, 1.0, (b, kv, p * rep, d), &dev)?;
        let mask = band_mask(0, p, 0, p, window, &dev)?;
        let square = full(CPU, &q, &k, &v, rep, mask.as_ref(), None)?;
        let plan = SlidingPlan::banded(p, window, block, &dev)?;
        let banded = sliding(CPU, &q, &k, &v, rep, &plan)?;
        let err = max_abs(&square, &banded);
        assert!(err <= 1e-5, "P {p} W {window} block {block}: output differs by {err:e}");
        check_grads(&square, &banded, &g, [&q, &k, &v], &format!("banded P {p} W {window} block {block}"))?;

        // Unmasked: query blocks through the recompute op against plain attention.
        let plain = full(CPU, &q, &k, &v, rep, None, None)?;
        let blocks: Vec<BandBlock> = (0..p)
            .step_by(block)
            .map(|q_start| BandBlock { q_start, q_len: block.min(p - q_start), k_start: 0, k_len: p, mask: None })
            .collect();
        let blocked = recompute(CPU, &q, &k, &v, rep, &blocks, None)?;
        assert!(max_abs(&plain, &blocked) <= 1e-5, "P {p} block {block}: blocked full attention");
        check_grads(&plain, &blocked, &g, [&q, &k, &v], &format!("blocked P {p} block {block}"))?;
    }
    Ok(())
}

/// A forward without a graph keeps its output; the tracked pass takes it (and
/// computes nothing) with the same output and the same gradients as computing it.
#[test]
fn the_tracked_pass_takes_the_kept_output() -> Result<()> {
    let dev = Device::Cpu;
    let (b, kv, rep, p, d) = (1, 2, 2, 40, 8);
    let q = Var::randn(0f32, 1.0, (b, kv, p * rep, d), &dev)?;
    let k = Var::randn(0f32, 1.0, (b, kv, p, d), &dev)?;
    let v = Var::randn(0f32, 1.0, (b, kv, p, d), &dev)?;
    let g = Tensor::randn(0f32, 1.0, (b, kv, p * rep, d), &dev)?;
    let blocks: Vec<BandBlock> = (0..p)
        .step_by(16)
        .map(|q_start| BandBlock { q_start, q_len: 16.min(p - q_start), k_start: 0, k_len: p, mask: None })
        .collect();
    let kept = KeptOutput::default();
    let first = recompute(CPU, &q.detach(), &k.detach(), &v.detach(), rep, &blocks, Some(&kept))?;
    let held = kept.take();
    assert!(held.is_some(), "the pass without a graph keeps its output");
    kept.0.set(held);
    let reused = recompute(CPU, &q, &k, &v, rep, &blocks, Some(&kept))?;
    assert!(kept.take().is_none(), "the tracked pass takes it");
    let computed = recompute(CPU, &q, &k, &v, rep, &blocks, None)?;
    assert_eq!(max_abs(&reused, &first), 0.0);
    assert_eq!(max_abs(&reused, &computed), 0.0);
    let (gr, gc) = (ops::mul(&reused, &g)?.sum_all()?.backward()?, ops::mul(&computed, &g)?.sum_all()?.backward()?);
    for var in [&q, &k, &v] {
        assert_eq!(max_abs(gr.get(var).unwrap(), gc.get(var).unwrap()), 0.0);
    }
    Ok(())
}

fn check_grads(reference: &Tensor, ours: &Tensor, g: &Tensor, vars: [&Var; 3], what: &str) -> Result<()> {
    {
        let gs = ops::mul(reference, g)?.sum_all()?.backward()?;
        let gb = ops::mul(ours, g)?.sum_all()?.backward()?;
        // Gradients sum over up to P rows: compare relative to their largest entry.
        for (name, var) in ["q", "k", "v"].into_iter().zip(vars) {
            let (a, b) = (gs.get(var).unwrap(), gb.get(var).unwrap());
            let scale = a.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
            let err = max_abs(a, b) / scale;
            assert!(err <= 1e-5, "{what}: d{name} differs by {err:e} (relative)");
        }
    }
    Ok(())
}

#[test]
fn plan_picks_square_at_short_lengths() -> Result<()> {
    let dev = Device::Cpu;
    let plan = |p: usize, dtype: DType| SlidingPlan::new(CPU, p, 128, dtype, &dev);
    assert!(matches!(plan(100, DType::F32)?, SlidingPlan::Unmasked));
    assert!(matches!(plan(250, DType::F32)?, SlidingPlan::Masked(_)));
    // The CPU kernels take the band once it skips keys; candle ops only later.
    assert!(matches!(plan(375, DType::F32)?, SlidingPlan::Banded(_)));
    assert!(matches!(plan(375, DType::BF16)?, SlidingPlan::Masked(_)));
    match plan(3000, DType::BF16)? {
        SlidingPlan::Banded(blocks) => {
            assert_eq!(blocks.iter().map(|b| b.q_len).sum::<usize>(), 3000);
            assert_eq!(blocks[0].k_start, 0);
            assert_eq!(blocks.last().unwrap().k_start + blocks.last().unwrap().k_len, 3000);
        }
        _ => panic!("3000 positions with window 128 should be banded"),
    }
    // Without CPU kernels f32 plans as bf16 does; the square policy never bands.
    let gpu = KernelPolicy::gpu();
    assert!(matches!(SlidingPlan::new(gpu, 375, 128, DType::F32, &dev)?, SlidingPlan::Masked(_)));
    assert!(matches!(SlidingPlan::new(gpu, 3000, 128, DType::F32, &dev)?, SlidingPlan::Banded(_)));
    let square = KernelPolicy { sliding: SlidingAttention::Square, ..CPU };
    assert!(matches!(SlidingPlan::new(square, 3000, 128, DType::F32, &dev)?, SlidingPlan::Masked(_)));
    let m = band_mask(10, 4, 0, 30, 5, &dev)?.unwrap().to_dtype(DType::F32)?;
    let row0 = m.get(0)?.squeeze(0)?.to_vec1::<f32>()?;
    assert_eq!(row0[5], 0.0);
    assert_eq!(row0[4], f32::MIN);
    assert_eq!(row0[15], 0.0);
    assert_eq!(row0[16], f32::MIN);
    Ok(())
}
