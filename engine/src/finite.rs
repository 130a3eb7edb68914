//! NaN and infinity caught where they enter (an adapter file, a latents file, a
//! sampling step, the decoder), so that an error names the cause instead of a song of
//! silence or NaN being written.

use candle_core::{DType, Tensor};

use crate::{Error, Result};

/// What is wrong with `t`'s values ("2 of 10 values are not finite ..."), or None
/// when every one is finite.
pub fn problem(t: &Tensor) -> Result<Option<String>> {
    let values = t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
    Ok(samples_problem(&values, &[]))
}

/// As [`problem`], over the values of `a` and `b`.
fn samples_problem(a: &[f32], b: &[f32]) -> Option<String> {
    let count = a.iter().chain(b).filter(|x| !x.is_finite()).count();
    let total = a.len() + b.len();
    (count > 0).then(|| format!("{count} of {total} values are not finite (NaN or infinite)"))
}

/// Errs with [`Error::NonFinite`] naming `what` unless every value of `t` is finite.
pub fn ensure_tensor(t: &Tensor, what: impl FnOnce() -> String) -> Result<()> {
    match problem(t)? {
        None => Ok(()),
        Some(problem) => Err(Error::NonFinite { what: what(), problem }),
    }
}

/// As [`ensure_tensor`], for a stereo song's two channels.
pub fn ensure_audio(left: &[f32], right: &[f32], what: impl FnOnce() -> String) -> Result<()> {
    match samples_problem(left, right) {
        None => Ok(()),
        Some(problem) => Err(Error::NonFinite { what: what(), problem }),
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    #[test]
    fn counts_nan_and_both_infinities_and_names_what_holds_them() {
        let t = Tensor::new(&[[1.0f32, f32::NAN], [f32::INFINITY, f32::NEG_INFINITY]], &Device::Cpu).unwrap();
        let err = ensure_tensor(&t, || "the test tensor".into()).unwrap_err().to_string();
        assert!(err.starts_with("the test tensor: 3 of 4 values are not finite"), "{err}");
        assert_eq!(problem(&Tensor::new(&[0.0f32, -1e30], &Device::Cpu).unwrap()).unwrap(), None);

        let err = ensure_audio(&[0.0, f32::NAN], &[0.5, 0.25], || "the song".into()).unwrap_err().to_string();
        assert!(err.starts_with("the song: 1 of 4 values are not finite"), "{err}");
        ensure_audio(&[0.0; 4], &[0.0; 4], || "silence".into()).unwrap();
    }
}
