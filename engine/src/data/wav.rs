//! A small WAV writer: the demo synthesizer writes its clips with it, and the tests
//! write every sample format the decoder must read (hound has no 64-bit float).

use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleFormat {
    /// 8 (unsigned), 16, 24 or 32-bit integer PCM.
    Int(u16),
    /// 32 or 64-bit IEEE float.
    Float(u16),
}

impl SampleFormat {
    fn bits(self) -> u16 {
        match self {
            SampleFormat::Int(b) | SampleFormat::Float(b) => b,
        }
    }

    fn push(self, out: &mut Vec<u8>, x: f32) {
        let x = x.clamp(-1.0, 1.0);
        match self {
            SampleFormat::Int(8) => out.push((x * 127.0 + 128.0).round() as u8),
            SampleFormat::Int(bits) => {
                let scale = ((1i64 << (bits - 1)) - 1) as f64;
                let v = (x as f64 * scale).round() as i64;
                out.extend_from_slice(&v.to_le_bytes()[..bits as usize / 8]);
            }
            SampleFormat::Float(32) => out.extend_from_slice(&x.to_le_bytes()),
            SampleFormat::Float(_) => out.extend_from_slice(&(x as f64).to_le_bytes()),
        }
    }
}

/// A complete WAV file. `channels` are equally long planar channels. Formats a plain
/// header cannot describe (more than two channels, more than 16 bits) get
/// WAVE_FORMAT_EXTENSIBLE, as the format requires.
pub fn wav_bytes(sample_rate: u32, format: SampleFormat, channels: &[Vec<f32>]) -> Vec<u8> {
    let n_ch = channels.len() as u16;
    let frames = channels.first().map_or(0, Vec::len);
    let bits = format.bits();
    let block = n_ch as u32 * bits as u32 / 8;
    let data_len = block * frames as u32;
    let extensible = n_ch > 2 || bits > 16;
    let tag: u16 = match format {
        SampleFormat::Int(_) => 1,
        SampleFormat::Float(_) => 3,
    };

    let mut fmt = Vec::new();
    fmt.extend_from_slice(&(if extensible { 0xFFFEu16 } else { tag }).to_le_bytes());
    fmt.extend_from_slice(&n_ch.to_le_bytes());
    fmt.extend_from_slice(&sample_rate.to_le_bytes());
    fmt.extend_from_slice(&(sample_rate * block).to_le_bytes());
    fmt.extend_from_slice(&(block as u16).to_le_bytes());
    fmt.extend_from_slice(&bits.to_le_bytes());
    if extensible {
        let mask: u32 = (1u32 << n_ch.min(18)) - 1; // FL, FR, FC, LFE, BL, BR, ...
        fmt.extend_from_slice(&22u16.to_le_bytes());
        fmt.extend_from_slice(&bits.to_le_bytes());
        fmt.extend_from_slice(&mask.to_le_bytes());
        fmt.extend_from_slice(&(tag as u32).to_le_bytes());
        fmt.extend_from_slice(&[0x00, 0x00, 0x10, 0x00, 0x80, 0x00, 0x00, 0xAA, 0x00, 0x38, 0x9B, 0x71]);
    }

    let mut out = Vec::with_capacity(44 + fmt.len() + data_len as usize);
    out.extend_from_slice(b"RIFF");
    out.extend_from_slice(&(4 + 8 + fmt.len() as u32 + 8 + data_len).to_le_bytes());
    out.extend_from_slice(b"WAVEfmt ");
    out.extend_from_slice(&(fmt.len() as u32).to_le_bytes());
    out.extend_from_slice(&fmt);
    out.extend_from_slice(b"data");
    out.extend_from_slice(&data_len.to_le_bytes());
    for i in 0..frames {
        for ch in channels {
            format.push(&mut out, ch[i]);
        }
    }
    out
}

pub fn write_wav(path: &Path, sample_rate: u32, format: SampleFormat, channels: &[Vec<f32>]) -> std::io::Result<()> {
    std::fs::write(path, wav_bytes(sample_rate, format, channels))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::audio::decode;
    use crate::data::testutil::{sine, write_file};

    #[test]
    fn every_sample_format_round_trips_through_the_decoder() {
        let dir = tempfile::tempdir().unwrap();
        let x = sine(440.0, 0.5, 22_050, 22_050);
        let y: Vec<f32> = x.iter().map(|v| -v).collect();
        for (format, tol) in [
            (SampleFormat::Int(8), 1.0 / 100.0),
            (SampleFormat::Int(16), 1e-4),
            (SampleFormat::Int(24), 1e-6),
            (SampleFormat::Int(32), 1e-6),
            (SampleFormat::Float(32), 1e-7),
            (SampleFormat::Float(64), 1e-7),
        ] {
            let name = format!("{format:?}.wav");
            let p = write_file(dir.path(), &name, &wav_bytes(22_050, format, &[x.clone(), y.clone()]));
            let a = decode(&p).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!((a.sample_rate, a.frames()), (22_050, x.len()), "{name}");
            let err =
                a.left.iter().zip(&x).chain(a.right.iter().zip(&y)).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            assert!(err < tol, "{name}: error {err}");
        }
    }
}
