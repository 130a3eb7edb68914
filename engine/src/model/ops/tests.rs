use super::*;
use candle_core::{DType, Device, Var};

const CPU: KernelPolicy = KernelPolicy::cpu();

/// Softmax composed from candle's ops, with the row maximum taken without a graph (a
/// constant shift: the result and its gradient do not depend on it): the reference.
fn softmax_composed(x: &Tensor) -> Result<Tensor> {
    let max = x.detach().max_keepdim(D::Minus1)?;
    let e = sub(x, &max)?.exp()?;
    let sum = e.sum_keepdim(D::Minus1)?;
    e.broadcast_div(&sum)
}

fn close(a: &Tensor, b: &Tensor) -> f32 {
    max_abs(&(a - b).unwrap())
}

#[test]
fn pruned_ops_match_candle_and_prune_constant_gradients() -> Result<()> {
    let dev = Device::Cpu;
    let x = Var::randn(0f32, 1., (2, 3, 4), &dev)?;
    let w = Tensor::randn(0f32, 1., (5, 4), &dev)?; // frozen
    let c = Tensor::randn(0f32, 1., (1, 1, 5), &dev)?; // constant
    let ours = mul(&linear(x.as_tensor(), &w, Some(&c.squeeze(0)?.squeeze(0)?))?, &c)?;
    let theirs = x.as_tensor().broadcast_matmul(&w.t()?)?.broadcast_add(&c)?.broadcast_mul(&c)?;
    assert!(close(&ours, &theirs) < 1e-6);

    let g_ours = softmax_last_dim(CPU, &ours)?.sqr()?.sum_all()?.backward()?;
    let g_theirs =
        (theirs.exp()?.broadcast_div(&theirs.exp()?.sum_keepdim(D::Minus1)?)?).sqr()?.sum_all()?.backward()?;
    assert!(close(g_ours.get(&x).unwrap(), g_theirs.get(&x).unwrap()) < 1e-5);
    // Only the variable has a gradient left: nothing was computed for w or c.
    let ids: Vec<_> = g_ours.get_ids().collect();
    assert_eq!(ids, vec![&x.id()]);
    Ok(())
}

/// The fused CPU softmax, RMSNorm and SwiGLU give the composed forms' values and
/// input gradients.
#[test]
fn fused_ops_match_composed_forms() -> Result<()> {
    let dev = Device::Cpu;
    let x = Var::randn(0f32, 3., (3, 5, 37), &dev)?;
    let g = Tensor::randn(0f32, 1., (3, 5, 37), &dev)?;
    let w = Tensor::randn(1f32, 0.2, 37, &dev)?;
    let g2 = Tensor::randn(0f32, 1., (3, 5, 37), &dev)?; // SwiGLU's `up` (frozen here)
                                                         // AdaLN modulation per batch item.
    let scale = Tensor::randn(1f32, 0.3, (3, 1, 37), &dev)?;
    let shift = Tensor::randn(0f32, 0.3, (3, 1, 37), &dev)?;
    for (name, fused, composed) in [
        ("softmax", softmax_last_dim(CPU, x.as_tensor())?, softmax_composed(x.as_tensor())?),
        ("rms_norm", rms_norm(CPU, x.as_tensor(), &w, 1e-6)?, rms_norm_composed(x.as_tensor(), &w, 1e-6)?),
        ("swiglu", swiglu(CPU, x.as_tensor(), &g2)?, mul(&x.as_tensor().silu()?, &g2)?),
        (
            "modulated_rms_norm",
            modulated_rms_norm(CPU, x.as_tensor(), &w, &scale, &shift, 1e-6)?,
            add(&mul(&rms_norm_composed(x.as_tensor(), &w, 1e-6)?, &scale)?, &shift)?,
        ),
    ] {
        // The inputs are random (candle's randn is unseeded) and SwiGLU's outputs
        // reach ~30, where one f32 ulp is ~2e-6: errors are relative.
        let err = rel_err(&fused, &composed);
        eprintln!("{name}: forward error {err:e}");
        assert!(err < 1e-6, "{name} forward differs by {err:e}");
        let gf = mul(&fused, &g)?.sum_all()?.backward()?;
        let gc = mul(&composed, &g)?.sum_all()?.backward()?;
        let err = rel_err(gf.get(&x).unwrap(), gc.get(&x).unwrap());
        eprintln!("{name}: gradient error {err:e}");
        assert!(err < 1e-5, "{name} gradient differs by {err:e}");
        assert_eq!(gf.get_ids().count(), 1, "{name}: only the input gets a gradient");
    }
    Ok(())
}

/// Rotate-half RoPE composed from candle's ops: the reference.
fn rope_composed(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let d = x.dim(D::Minus1)?;
    let rotated =
        Tensor::cat(&[&x.narrow(D::Minus1, d / 2, d / 2)?.neg()?, &x.narrow(D::Minus1, 0, d / 2)?], D::Minus1)?;
    x.broadcast_mul(cos)? + rotated.broadcast_mul(sin)?
}

/// Without the CPU kernels, RMSNorm, softmax and RoPE (candle-nn's forwards, backwards in
/// candle ops) give the composed forms' values and input gradients, in f32 and in the
/// bf16 a GPU computes in (where each rounds differently: one bf16 ulp is 2^-8).
#[test]
fn device_ops_match_composed_forms() -> Result<()> {
    let dev = Device::Cpu;
    let gpu = KernelPolicy::gpu();
    for (dtype, tolerance) in [(DType::F32, 1e-5), (DType::BF16, 2e-2)] {
        let x = Var::from_tensor(&Tensor::randn(0f32, 3., (3, 5, 64), &dev)?.to_dtype(dtype)?)?;
        let g = Tensor::randn(0f32, 1., (3, 5, 64), &dev)?.to_dtype(dtype)?;
        let w = Tensor::randn(1f32, 0.2, 64, &dev)?.to_dtype(dtype)?;
        let scores = Var::from_tensor(&Tensor::randn(0f32, 3., (3, 5, 64), &dev)?)?;
        // RoPE over 5 positions of 2 heads of 32, tables [P, 1, D] as cat([f, f]).
        let heads = Var::from_tensor(&x.as_tensor().reshape((3, 5, 2, 32))?)?;
        let angles = Tensor::randn(0f32, 2., (5, 1, 16), &dev)?;
        let (cos, sin) = (Tensor::cat(&[&angles, &angles], 2)?.cos()?, Tensor::cat(&[&angles, &angles], 2)?.sin()?);
        let (cos, sin) = (cos.to_dtype(dtype)?, sin.to_dtype(dtype)?);
        for (name, input, fused, composed) in [
            (
                "rope",
                &heads,
                rope(heads.as_tensor(), &cos, &sin, 1.0)?.reshape((3, 5, 64))?,
                rope_composed(heads.as_tensor(), &cos, &sin)?.reshape((3, 5, 64))?,
            ),
            ("rms_norm", &x, rms_norm(gpu, x.as_tensor(), &w, 1e-6)?, rms_norm_composed(x.as_tensor(), &w, 1e-6)?),
            ("softmax", &scores, softmax_last_dim(gpu, scores.as_tensor())?, softmax_composed(scores.as_tensor())?),
        ] {
            let (gf, gc) = (mul(&fused, &g.to_dtype(fused.dtype())?)?, mul(&composed, &g.to_dtype(fused.dtype())?)?);
            let err = rel_err(&fused.to_dtype(DType::F32)?, &composed.to_dtype(DType::F32)?);
            let (gf, gc) = (gf.sum_all()?.backward()?, gc.sum_all()?.backward()?);
            let grad = |s: &candle_core::backprop::GradStore| s.get(input).unwrap().to_dtype(DType::F32);
            let grad_err = rel_err(&grad(&gf)?, &grad(&gc)?);
            eprintln!("{name} {dtype:?}: forward error {err:e}, gradient error {grad_err:e}");
            assert!(err < tolerance && grad_err < tolerance, "{name} {dtype:?}: {err:e}, {grad_err:e}");
            assert_eq!(gf.get_ids().count(), 1, "{name}: only the input gets a gradient");
        }
    }
    Ok(())
}

#[test]
fn gated_add_matches_composed_for_both_inputs() -> Result<()> {
    let dev = Device::Cpu;
    let x = Var::randn(0f32, 1., (2, 5, 19), &dev)?;
    let f = Var::randn(0f32, 1., (2, 5, 19), &dev)?;
    let gate = Tensor::randn(0f32, 1., (2, 1, 19), &dev)?;
    let g = Tensor::randn(0f32, 1., (2, 5, 19), &dev)?;
    let fused = gated_add(CPU, x.as_tensor(), f.as_tensor(), &gate)?;
    let composed = (x.as_tensor() + f.as_tensor().broadcast_mul(&gate)?)?;
    let err = rel_err(&fused, &composed);
    let gf = mul(&fused, &g)?.sum_all()?.backward()?;
    let gc = mul(&composed, &g)?.sum_all()?.backward()?;
    let (ex, ef) =
        (rel_err(gf.get(&x).unwrap(), gc.get(&x).unwrap()), rel_err(gf.get(&f).unwrap(), gc.get(&f).unwrap()));
    eprintln!("gated_add: forward error {err:e}, dx {ex:e}, df {ef:e}");
    assert!(err < 1e-6 && ex < 1e-6 && ef < 1e-6);
    Ok(())
}

/// Built under the GPU policy, each CPU-only op of this module errs in its forward,
/// naming itself, as on a device without a forward for it; under the CPU policy it runs.
#[test]
fn cpu_only_ops_err_under_the_gpu_policy() -> Result<()> {
    let gpu = KernelPolicy::gpu();
    let dev = Device::Cpu;
    let x = Tensor::randn(0f32, 1., (2, 3, 8), &dev)?;
    let w = Tensor::ones(8, DType::F32, &dev)?;
    let gate = Tensor::ones((2, 1, 8), DType::F32, &dev)?;
    let runs = [
        ("fused-softmax", x.apply_op1_no_bwd(&Softmax(gpu))),
        ("fused-softmax-bwd", x.apply_op2_no_bwd(&x, &SoftmaxBwd(gpu))),
        ("fused-swiglu", x.apply_op2_no_bwd(&x, &Swiglu(gpu))),
        ("fused-swiglu-bwd", x.apply_op3_no_bwd(&x, &x, &SwigluBwd { wrt_gate: true, k: gpu })),
        ("fused-rms-norm", x.apply_op2_no_bwd(&w, &RmsNorm { eps: 1e-6, shift: None, k: gpu })),
        ("fused-rms-norm-bwd", x.apply_op3_no_bwd(&w, &x, &RmsNormBwd { eps: 1e-6, k: gpu })),
        ("fused-gated-add", x.apply_op2_no_bwd(&x, &GatedAdd { gate, k: gpu })),
    ];
    for (name, run) in runs {
        let err = run.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains(name) && err.contains("no Metal or CUDA forward"), "{name}: {err:?}");
    }
    x.apply_op1_no_bwd(&Softmax(CPU))?;
    Ok(())
}

#[test]
fn rms_norm_matches_formula_in_bf16_and_f32() -> Result<()> {
    let dev = Device::Cpu;
    let x = Tensor::randn(0f32, 2., (3, 8), &dev)?;
    let w = Tensor::randn(1f32, 0.1, 8, &dev)?;
    let expect = x.broadcast_div(&(x.sqr()?.mean_keepdim(1)? + 1e-6)?.sqrt()?)?.broadcast_mul(&w)?;
    assert!(close(&rms_norm(CPU, &x, &w, 1e-6)?, &expect) < 1e-5);
    let half = rms_norm(CPU, &x.to_dtype(DType::BF16)?, &w.to_dtype(DType::BF16)?, 1e-6)?;
    assert_eq!(half.dtype(), DType::BF16);
    assert!(close(&half.to_dtype(DType::F32)?, &expect) < 0.05);
    Ok(())
}
