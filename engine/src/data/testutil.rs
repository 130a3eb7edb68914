//! Test helpers: signals and the non-WAV files the tests write themselves (a minimal
//! verbatim FLAC encoder and an AIFF writer), so no fixture or tool is needed; small
//! models and a preparation that records its events, with lookups into them.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::wav::{wav_bytes, SampleFormat};
use super::{prepare_dataset, DataEvent, DataSpec, FileUse, IssueKind, LatentCache, PreparedDataset};
use crate::cancel::Cancel;
use crate::codec::condition::HashConditioner;
use crate::codec::encode::MelEncoder;
use crate::error::Result;

pub fn sine(freq: f64, amp: f32, rate: u32, frames: usize) -> Vec<f32> {
    (0..frames).map(|i| amp * (2.0 * std::f64::consts::PI * freq * i as f64 / rate as f64).sin() as f32).collect()
}

pub fn write_file(dir: &Path, name: impl AsRef<std::ffi::OsStr>, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name.as_ref());
    std::fs::write(&p, bytes).unwrap();
    p
}

/// A named pipe at `path` (that nobody writes to).
pub fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo {}", path.display());
}

fn to_i16(x: f32) -> i16 {
    (x.clamp(-1.0, 1.0) * 32767.0).round() as i16
}

fn crc8(data: &[u8]) -> u8 {
    data.iter().fold(0u8, |mut crc, &b| {
        crc ^= b;
        for _ in 0..8 {
            crc = if crc & 0x80 != 0 { (crc << 1) ^ 0x07 } else { crc << 1 };
        }
        crc
    })
}

fn crc16(data: &[u8]) -> u16 {
    data.iter().fold(0u16, |mut crc, &b| {
        crc ^= (b as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x8005 } else { crc << 1 };
        }
        crc
    })
}

/// FLAC's UTF-8-style frame number.
fn utf8_number(n: u32, out: &mut Vec<u8>) {
    if n < 0x80 {
        out.push(n as u8);
        return;
    }
    // k continuation bytes of 6 bits; the lead byte keeps 6 - k bits after k + 1 ones.
    let mut tail = Vec::new();
    let mut v = n;
    let mut k = 0;
    while k == 0 || v >= 1 << (6 - k) {
        tail.push(0x80 | (v & 0x3F) as u8);
        v >>= 6;
        k += 1;
    }
    out.push((0xFF00u16 >> (k + 1)) as u8 | v as u8);
    out.extend(tail.iter().rev());
}

/// 16-bit FLAC with verbatim subframes: valid FLAC, just not compressed.
pub fn flac_bytes(rate: u32, channels: &[Vec<f32>]) -> Vec<u8> {
    const BLOCK: usize = 4096;
    let n_ch = channels.len();
    let frames = channels[0].len();
    let mut out = b"fLaC".to_vec();
    out.extend_from_slice(&[0x80, 0, 0, 34]); // last block, STREAMINFO, 34 bytes
    out.extend_from_slice(&(BLOCK as u16).to_be_bytes());
    out.extend_from_slice(&(BLOCK as u16).to_be_bytes());
    out.extend_from_slice(&[0; 6]); // frame sizes unknown
    let packed: u64 = (rate as u64) << 44 | ((n_ch as u64 - 1) << 41) | (15 << 36) | frames as u64;
    out.extend_from_slice(&packed.to_be_bytes());
    out.extend_from_slice(&[0; 16]); // MD5 unknown
    for (i, start) in (0..frames).step_by(BLOCK).enumerate() {
        let len = BLOCK.min(frames - start);
        let mut f = vec![0xFF, 0xF8, 0x70, ((n_ch as u8 - 1) << 4) | 0x08];
        utf8_number(i as u32, &mut f);
        f.extend_from_slice(&(len as u16 - 1).to_be_bytes());
        f.push(crc8(&f));
        for ch in channels {
            f.push(0x02); // verbatim subframe
            for &x in &ch[start..start + len] {
                f.extend_from_slice(&to_i16(x).to_be_bytes());
            }
        }
        let crc = crc16(&f);
        f.extend_from_slice(&crc.to_be_bytes());
        out.extend_from_slice(&f);
    }
    out
}

/// 16-bit big-endian AIFF.
pub fn aiff_bytes(rate: u32, channels: &[Vec<f32>]) -> Vec<u8> {
    let n_ch = channels.len();
    let frames = channels[0].len();
    let mut comm = Vec::new();
    comm.extend_from_slice(&(n_ch as i16).to_be_bytes());
    comm.extend_from_slice(&(frames as u32).to_be_bytes());
    comm.extend_from_slice(&16i16.to_be_bytes());
    // 80-bit extended float of an integer rate: explicit integer bit at the top.
    let e = 31 - rate.leading_zeros();
    comm.extend_from_slice(&((16383 + e) as u16).to_be_bytes());
    comm.extend_from_slice(&((rate as u64) << (63 - e)).to_be_bytes());
    let mut ssnd = vec![0u8; 8]; // offset, block size
    for i in 0..frames {
        for ch in channels {
            ssnd.extend_from_slice(&to_i16(ch[i]).to_be_bytes());
        }
    }
    let mut out = b"FORM".to_vec();
    out.extend_from_slice(&((4 + 8 + comm.len() + 8 + ssnd.len()) as u32).to_be_bytes());
    out.extend_from_slice(b"AIFF");
    for (id, body) in [(b"COMM", &comm), (b"SSND", &ssnd)] {
        out.extend_from_slice(id);
        out.extend_from_slice(&(body.len() as u32).to_be_bytes());
        out.extend_from_slice(body);
    }
    out
}

/// Deterministic pseudo-random bytes (xorshift), for "random bytes" files.
pub fn noise_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect()
}

pub fn models() -> (MelEncoder, HashConditioner) {
    let enc = MelEncoder::new();
    let cond = HashConditioner::for_encoder(16, &enc).unwrap();
    (enc, cond.with_max_tokens(32, 16))
}

pub fn stereo_sine(rate: u32, seconds: f64, freq: f64) -> Vec<Vec<f32>> {
    let n = (rate as f64 * seconds) as usize;
    vec![sine(freq, 0.5, rate, n), sine(freq * 1.5, 0.3, rate, n)]
}

pub fn good_wav(dir: &Path, name: impl AsRef<OsStr>, seconds: f64, freq: f64) -> PathBuf {
    write_file(dir, name, &wav_bytes(44_100, SampleFormat::Int(16), &stereo_sine(44_100, seconds, freq)))
}

pub fn prepare(spec: &DataSpec, cache: Option<&LatentCache>) -> (Result<PreparedDataset>, Vec<DataEvent>) {
    let (enc, cond) = models();
    let mut events = Vec::new();
    let r = prepare_dataset(spec, &enc, &cond, cache, &Cancel::never(), &mut |e| events.push(e));
    (r, events)
}

/// The reason of the first issue of `kind` about the file called `name`.
pub fn find_issue<'a>(events: &'a [DataEvent], kind: IssueKind, name: &[u8]) -> Option<&'a str> {
    events.iter().find_map(|e| match e {
        DataEvent::Issue(i) if i.kind == kind && i.file.file_name()?.as_bytes() == name => Some(i.reason.as_str()),
        _ => None,
    })
}

/// Why the file called `name` was skipped.
pub fn issue_for<'a>(events: &'a [DataEvent], name: &[u8]) -> Option<&'a str> {
    find_issue(events, IssueKind::Skipped, name)
}

pub fn warning_for<'a>(events: &'a [DataEvent], name: &[u8]) -> Option<&'a str> {
    find_issue(events, IssueKind::Warning, name)
}

/// What the per-file event says of the file called `name`.
pub fn use_of<'a>(events: &'a [DataEvent], name: &str) -> Option<&'a FileUse> {
    events.iter().find_map(|e| match e {
        DataEvent::Used(u) if u.file.file_name()? == name => Some(u),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::audio::decode;

    #[test]
    fn utf8_frame_numbers() {
        let enc = |n| {
            let mut v = Vec::new();
            utf8_number(n, &mut v);
            v
        };
        assert_eq!(enc(5), [5]);
        assert_eq!(enc(0x80), "\u{80}".as_bytes());
        assert_eq!(enc(0x7FF), "\u{7FF}".as_bytes());
        assert_eq!(enc(0x1234), "\u{1234}".as_bytes());
        assert_eq!(enc(0x10FFFF), "\u{10FFFF}".as_bytes());
    }

    #[test]
    fn flac_and_aiff_decode() {
        let dir = tempfile::tempdir().unwrap();
        let x = sine(330.0, 0.4, 44_100, 44_100 + 123);
        let y = sine(550.0, 0.3, 44_100, 44_100 + 123);
        for (name, bytes) in [
            ("a.flac", flac_bytes(44_100, &[x.clone(), y.clone()])),
            ("a.aiff", aiff_bytes(44_100, &[x.clone(), y.clone()])),
        ] {
            let a = decode(&write_file(dir.path(), name, &bytes)).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!((a.sample_rate, a.frames()), (44_100, x.len()), "{name}");
            let err =
                a.left.iter().zip(&x).chain(a.right.iter().zip(&y)).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            assert!(err < 1e-4, "{name}: error {err}");
        }
    }
}
