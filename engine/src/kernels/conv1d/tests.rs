use super::*;
use candle_core::{Device, Tensor};

fn random(n: usize, seed: u64) -> Vec<f32> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

fn tensor(v: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape, &Device::Cpu).unwrap()
}

/// candle's Snake, as the model computed it before these kernels.
fn candle_snake(x: &Tensor, s: Snake) -> Tensor {
    let c = s.alpha.len();
    let (a, b) = (tensor(s.alpha, &[1, c, 1]), tensor(s.inv_beta, &[1, c, 1]));
    (x + x.broadcast_mul(&a).unwrap().sin().unwrap().sqr().unwrap().broadcast_mul(&b).unwrap()).unwrap()
}

fn max_diff(a: &[f32], b: &Tensor) -> f32 {
    let b: Vec<f32> = b.flatten_all().unwrap().to_vec1().unwrap();
    assert_eq!(a.len(), b.len(), "lengths differ");
    a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn snake_params(c: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let alpha = random(c, seed).iter().map(|a| (a * 0.5).exp()).collect();
    let inv_beta = random(c, seed + 1).iter().map(|b| 1.0 / ((b * 0.5).exp() + 1e-9)).collect();
    (alpha, inv_beta)
}

#[test]
fn convs_match_candles_im2col_path() {
    // Both lengths with every tile this CPU has: 1000 columns span several chunks.
    for (m, len) in tiles_and_lengths(&[181, 1000]) {
        convs_match_candle(&m, len);
    }
}

/// Every register tile this CPU runs, with each length.
fn tiles_and_lengths(lens: &[usize]) -> Vec<(Micro, usize)> {
    Micro::available().into_iter().flat_map(|m| lens.iter().map(move |&len| (m, len))).collect()
}

fn convs_match_candle(m: &Micro, len: usize) {
    let (cin, cout) = (5, 7);
    let x = random(cin * len, 1);
    let (alpha, inv_beta) = snake_params(cin, 2);
    let snake = Snake { alpha: &alpha, inv_beta: &inv_beta };
    // (k, stride, dilation, padding): the VAE's k7 dilated units, k1, k3, strided k = 2s.
    for (k, stride, dilation, padding) in [
        (7, 1, 1, 3),
        (7, 1, 3, 9),
        (7, 1, 9, 27),
        (1, 1, 1, 0),
        (3, 1, 1, 1),
        (4, 2, 1, 1),
        (12, 6, 1, 3),
        (20, 10, 1, 5),
    ] {
        let w = random(cout * cin * k, 3 + k as u64);
        let b = random(cout, 4);
        let conv = Conv { weight: &w, bias: Some(&b), cin, cout, k, stride, dilation, padding };
        let xt = tensor(&x, &[1, cin, len]);
        for fused in [false, true] {
            let input = if fused { candle_snake(&xt, snake) } else { xt.clone() };
            let want = input
                .conv1d(&tensor(&w, &[cout, cin, k]), padding, stride, dilation, 1)
                .unwrap()
                .broadcast_add(&tensor(&b, &[1, cout, 1]))
                .unwrap();
            let (got, n_out) = conv1d_on(m, &x, len, &conv, fused.then_some(snake));
            assert_eq!(n_out, want.dim(2).unwrap());
            let err = max_diff(&got, &want);
            let tile = m.name();
            assert!(err < 1e-5, "{tile} len {len} k {k} stride {stride} dilation {dilation} snake {fused}: err {err}");
        }
    }
}

#[test]
fn residual_unit_matches_its_definition() {
    for (m, len) in tiles_and_lengths(&[97, 1000]) {
        residual_unit_matches(&m, len);
    }
}

fn residual_unit_matches(m: &Micro, len: usize) {
    let c = 6;
    let x = random(c * len, 5);
    let (a1, b1) = snake_params(c, 6);
    let (a2, b2) = snake_params(c, 8);
    let (w1, bias1, w2, bias2) = (random(c * c * 7, 10), random(c, 11), random(c * c, 12), random(c, 13));
    let conv1 = Conv { weight: &w1, bias: Some(&bias1), cin: c, cout: c, k: 7, stride: 1, dilation: 3, padding: 9 };
    let conv2 = Conv { weight: &w2, bias: Some(&bias2), cin: c, cout: c, k: 1, stride: 1, dilation: 1, padding: 0 };
    let (s1, s2) = (Snake { alpha: &a1, inv_beta: &b1 }, Snake { alpha: &a2, inv_beta: &b2 });
    let got = residual_unit_on(m, &x, len, (s1, &conv1), (s2, &conv2));
    let xt = tensor(&x, &[1, c, len]);
    let h = candle_snake(&xt, s1)
        .conv1d(&tensor(&w1, &[c, c, 7]), 9, 1, 3, 1)
        .unwrap()
        .broadcast_add(&tensor(&bias1, &[1, c, 1]))
        .unwrap();
    let y = candle_snake(&h, s2)
        .conv1d(&tensor(&w2, &[c, c, 1]), 0, 1, 1, 1)
        .unwrap()
        .broadcast_add(&tensor(&bias2, &[1, c, 1]))
        .unwrap();
    let err = max_diff(&got, &(xt + y).unwrap());
    assert!(err < 1e-5, "{} len {len}: residual unit err {err}", m.name());
}

#[test]
fn transposed_conv_matches_candles_col2im_path() {
    for (m, len) in tiles_and_lengths(&[53, 400]) {
        transposed_conv_matches(&m, len);
    }
}

fn transposed_conv_matches(m: &Micro, len: usize) {
    let (cin, cout) = (6, 4);
    let x = random(cin * len, 20);
    let (alpha, inv_beta) = snake_params(cin, 21);
    let snake = Snake { alpha: &alpha, inv_beta: &inv_beta };
    for s in [2, 4, 6, 10] {
        let w = random(cin * cout * 2 * s, 22 + s as u64);
        let b = random(cout, 23);
        let got = conv_transpose1d_on(m, &x, len, (&w, &b), (cin, cout, s), Some(snake));
        let xt = candle_snake(&tensor(&x, &[1, cin, len]), snake);
        let full = xt.conv_transpose1d(&tensor(&w, &[cin, cout, 2 * s]), 0, 0, s, 1, 1).unwrap();
        let want = full.narrow(2, s.div_ceil(2), len * s).unwrap().broadcast_add(&tensor(&b, &[1, cout, 1])).unwrap();
        let err = max_diff(&got, &want);
        assert!(err < 1e-5, "{} len {len} stride {s}: err {err}", m.name());
    }
}
