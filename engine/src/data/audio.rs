//! Decode any supported file to f32 stereo (symphonia), resample to the model's rate
//! (rubato, band-limited FFT resampler), and cut to a maximum length or a crop.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use rubato::{FftFixedIn, Resampler};
use symphonia::core::audio::SampleBuffer;
use symphonia::core::codecs::{DecoderOptions, CODEC_TYPE_NULL};
use symphonia::core::errors::Error as SymError;
use symphonia::core::formats::FormatOptions;
use symphonia::core::io::MediaSourceStream;
use symphonia::core::meta::MetadataOptions;
use symphonia::core::probe::Hint;

use crate::codec::StereoAudio;

/// Below this peak a file counts as silent (-80 dBFS): nothing to learn from.
const SILENCE_PEAK: f32 = 1e-4;
/// Shorter files are not music to learn from.
pub const MIN_SECONDS: f64 = 1.0;
/// Decode errors tolerated before a file counts as corrupt (a stray bad frame in a
/// long MP3 is common and harmless).
const MAX_DECODE_ERRORS: usize = 3;
/// Audio missing between two packets beyond this is damage, not a skipped bad frame.
const MAX_GAP_SECONDS: f64 = 1.0;

/// A decoded file, and the length its container states (when it states one).
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    pub audio: StereoAudio,
    /// Frames the header promises (`n_frames`), at the audio's own rate.
    pub stated_frames: Option<u64>,
    /// An Ogg stream whose end-of-stream page is missing: the file was cut short,
    /// though how much is missing is unknown (an Ogg header states no length; the
    /// last page's position does).
    pub unterminated: bool,
}

impl Decoded {
    /// Why the file looks cut short, when far fewer frames decode than the header
    /// states: more than 1 s or 1% missing, whichever is more. Codec padding and
    /// estimated lengths differ by milliseconds; a cut download loses far more.
    pub fn shortfall(&self) -> Option<String> {
        if self.unterminated {
            return Some(format!(
                "truncated: the Ogg stream has no end page, only {:.1} s decode",
                self.audio.duration_seconds()
            ));
        }
        let stated = self.stated_frames?;
        let decoded = self.audio.frames() as u64;
        let rate = self.audio.sample_rate;
        let tolerance = (stated / 100).max(u64::from(rate));
        (decoded.saturating_add(tolerance) < stated).then(|| {
            format!(
                "truncated or damaged: the header states {:.1} s, only {:.1} s decode",
                stated as f64 / f64::from(rate),
                self.audio.duration_seconds()
            )
        })
    }
}

/// Decodes a file to stereo at its own sample rate (see `decode_file`).
pub fn decode(path: &Path) -> Result<StereoAudio, String> {
    decode_file(path).map(|d| d.audio)
}

/// Decodes a file to stereo at its own sample rate, with the length its header
/// states. Mono is duplicated to both channels; with more than two channels the
/// first two (front left/right in every standard layout) are kept. A file that ends
/// early keeps what decodes (see `Decoded::shortfall`). The error is a reason for
/// the user, without the path.
pub fn decode_file(path: &Path) -> Result<Decoded, String> {
    let file = File::open(path).map_err(|e| format!("cannot open: {e}"))?;
    let len = file.metadata().map_err(|e| format!("cannot read: {e}"))?.len();
    if len == 0 {
        return Err("empty file (0 bytes)".into());
    }
    let mut hint = Hint::new();
    if let Some(ext) = path.extension().and_then(|e| e.to_str()) {
        hint.with_extension(ext);
    }
    let stream = MediaSourceStream::new(Box::new(file), Default::default());
    let format_opts = FormatOptions { enable_gapless: true, ..Default::default() };
    let probed = symphonia::default::get_probe()
        .format(&hint, stream, &format_opts, &MetadataOptions::default())
        .map_err(|e| format!("not a readable audio file ({e})"))?;
    let mut format = probed.format;
    let track = format.tracks().iter().find(|t| t.codec_params.codec != CODEC_TYPE_NULL).ok_or("no audio track")?;
    let track_id = track.id;
    let time_base = track.codec_params.time_base;
    let expected_frames = track.codec_params.n_frames;
    let mut sample_rate = track.codec_params.sample_rate;
    let mut decoder = symphonia::default::get_codecs()
        .make(&track.codec_params, &DecoderOptions::default())
        .map_err(|e| format!("unsupported codec ({e})"))?;

    let (mut left, mut right) = (Vec::new(), Vec::new());
    let mut errors = 0usize;
    let mut first_packet_s = None;
    loop {
        let packet = match format.next_packet() {
            Ok(p) => p,
            Err(SymError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(SymError::ResetRequired) => break,
            Err(e) => return Err(format!("corrupt audio data ({e})")),
        };
        if packet.track_id() != track_id {
            continue;
        }
        if let (Some(tb), Some(rate)) = (time_base, sample_rate) {
            let t = tb.calc_time(packet.ts());
            let at = t.seconds as f64 + t.frac;
            let decoded_s = left.len() as f64 / f64::from(rate);
            let gap = at - *first_packet_s.get_or_insert(at) - decoded_s;
            // The reader resynced over damage: audio is missing in the middle, and
            // what decodes is not the song.
            if gap > MAX_GAP_SECONDS {
                return Err(format!("corrupt audio data ({gap:.1} s missing after {decoded_s:.1} s)"));
            }
        }
        let decoded = match decoder.decode(&packet) {
            Ok(d) => d,
            Err(SymError::DecodeError(e)) => {
                errors += 1;
                if errors > MAX_DECODE_ERRORS {
                    return Err(format!("corrupt audio data ({e})"));
                }
                continue;
            }
            Err(SymError::IoError(_)) => break,
            Err(e) => return Err(format!("cannot decode ({e})")),
        };
        let spec = *decoded.spec();
        sample_rate = Some(spec.rate);
        let mut buf = SampleBuffer::<f32>::new(decoded.capacity() as u64, spec);
        buf.copy_interleaved_ref(decoded);
        let channels = spec.channels.count();
        if channels == 0 {
            return Err("audio has no channels".into());
        }
        for frame in buf.samples().chunks_exact(channels) {
            left.push(frame[0]);
            right.push(frame[if channels > 1 { 1 } else { 0 }]);
        }
    }

    let sample_rate = sample_rate.ok_or("unknown sample rate")?;
    Ok(Decoded {
        audio: StereoAudio { sample_rate, left, right },
        stated_frames: expected_frames,
        // symphonia states an Ogg stream's length only once it found the last page.
        unterminated: expected_frames.is_none() && is_ogg(path),
    })
}

/// Whether the file is an Ogg stream (it starts with a page's "OggS").
fn is_ogg(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    let read = File::open(path).and_then(|mut f| f.read_exact(&mut magic));
    read.is_ok() && &magic == b"OggS"
}

/// Checks that decoded audio is worth training on.
pub fn check_usable(audio: &StereoAudio) -> Result<(), String> {
    if audio.duration_seconds() < MIN_SECONDS {
        return Err(format!("too short ({:.2} s, need at least {MIN_SECONDS} s)", audio.duration_seconds()));
    }
    if audio.peak() < SILENCE_PEAK {
        return Err("silent (peak below -80 dBFS)".into());
    }
    if audio.left.iter().chain(&audio.right).any(|x| !x.is_finite()) {
        return Err("contains non-finite samples".into());
    }
    Ok(())
}

/// Resamples to `rate` with rubato's band-limited FFT resampler; output length is
/// `ceil(frames * rate / input rate)`, aligned (the resampler's delay is removed).
pub fn resample(audio: &StereoAudio, rate: u32) -> Result<StereoAudio, String> {
    if audio.sample_rate == rate {
        return Ok(audio.clone());
    }
    let err = |e: &dyn std::fmt::Display| format!("resampling {} Hz -> {rate} Hz: {e}", audio.sample_rate);
    let mut r = FftFixedIn::<f32>::new(audio.sample_rate as usize, rate as usize, 1024, 2, 2).map_err(|e| err(&e))?;
    let n = audio.frames();
    let want = (n as u64 * rate as u64).div_ceil(audio.sample_rate as u64) as usize;
    let delay = r.output_delay();
    let mut out = [Vec::with_capacity(want + delay), Vec::with_capacity(want + delay)];
    let push = |out: &mut [Vec<f32>; 2], chunk: Vec<Vec<f32>>| {
        for (o, c) in out.iter_mut().zip(chunk) {
            o.extend_from_slice(&c);
        }
    };
    let mut pos = 0;
    while pos + r.input_frames_next() <= n {
        let end = pos + r.input_frames_next();
        push(&mut out, r.process(&[&audio.left[pos..end], &audio.right[pos..end]], None).map_err(|e| err(&e))?);
        pos = end;
    }
    if pos < n {
        let rest = [&audio.left[pos..], &audio.right[pos..]];
        push(&mut out, r.process_partial(Some(&rest), None).map_err(|e| err(&e))?);
    }
    while out[0].len() < want + delay {
        push(&mut out, r.process_partial::<&[f32]>(None, None).map_err(|e| err(&e))?);
    }
    let [left, right] = out.map(|mut c| {
        c.drain(..delay);
        c.truncate(want);
        c
    });
    Ok(StereoAudio { sample_rate: rate, left, right })
}

/// Which part of a song to train on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Cut {
    /// The first `max_seconds` (ACE-Step's rule).
    Head { max_seconds: f64 },
    /// `seconds` long, starting at `offset` (a fraction 0..=1 of the free room).
    Crop { seconds: f64, offset: f64 },
}

impl Cut {
    /// Seconds of a `seconds`-long song the cut keeps.
    pub fn seconds_of(&self, seconds: f64) -> f64 {
        match *self {
            Cut::Head { max_seconds } => seconds.min(max_seconds),
            Cut::Crop { seconds: len, .. } => seconds.min(len),
        }
    }

    pub fn apply(&self, audio: &StereoAudio) -> StereoAudio {
        let rate = audio.sample_rate as f64;
        match *self {
            Cut::Head { max_seconds } => audio.slice(0, (max_seconds * rate) as usize),
            Cut::Crop { seconds, offset } => {
                let len = (seconds * rate) as usize;
                let room = audio.frames().saturating_sub(len);
                let start = (room as f64 * offset.clamp(0.0, 1.0)).round() as usize;
                audio.slice(start, len)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::testutil::{sine, write_file};
    use crate::data::wav::{wav_bytes, SampleFormat};

    /// Frequency by counting zero crossings; amplitude by RMS * sqrt(2).
    fn freq_and_amp(x: &[f32], rate: u32) -> (f64, f64) {
        let crossings = x.windows(2).filter(|w| w[0] < 0.0 && w[1] >= 0.0).count();
        let freq = crossings as f64 * rate as f64 / x.len() as f64;
        let rms = (x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / x.len() as f64).sqrt();
        (freq, rms * 2f64.sqrt())
    }

    #[test]
    fn resampling_keeps_frequency_amplitude_and_length() {
        for (from, to) in [(44_100, 48_000), (8_000, 48_000), (192_000, 48_000)] {
            let x = sine(1000.0, 0.5, from, from as usize * 2);
            let a = StereoAudio { sample_rate: from, left: x.clone(), right: x };
            let b = resample(&a, to).unwrap();
            assert_eq!(b.sample_rate, to);
            assert_eq!(b.frames(), (2 * to) as usize);
            assert_eq!(b.left, b.right);
            // Skip the edges, where the band-limited filter rings.
            let mid = &b.left[to as usize / 10..b.frames() - to as usize / 10];
            let (f, amp) = freq_and_amp(mid, to);
            assert!((f - 1000.0).abs() < 2.0, "{from}->{to}: {f} Hz");
            assert!((amp - 0.5).abs() < 0.01, "{from}->{to}: amplitude {amp}");
            // Aligned: the resampled sine matches the ideal one sample by sample.
            let ideal = sine(1000.0, 0.5, to, b.frames());
            let worst = mid.iter().zip(&ideal[to as usize / 10..]).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            assert!(worst < 0.02, "{from}->{to}: off the ideal sine by {worst}");
        }
    }

    /// MP3, Ogg Vorbis, AAC and ALAC in M4A: small files ffmpeg made (see testdata/).
    #[test]
    fn compressed_formats_decode() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/data/testdata");
        for (name, rate) in
            [("tone.mp3", 44_100), ("tone.ogg", 32_000), ("tone_aac.m4a", 48_000), ("tone_alac.m4a", 16_000)]
        {
            let a = decode(&dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(a.sample_rate, rate, "{name}");
            assert!((a.duration_seconds() - 1.5).abs() < 0.05, "{name}: {} s", a.duration_seconds());
            let mid = |x: &[f32]| x[rate as usize / 4..rate as usize * 5 / 4].to_vec();
            for (channel, freq) in [(&a.left, 440.0), (&a.right, 660.0)] {
                let (f, amp) = freq_and_amp(&mid(channel), rate);
                assert!((f - freq).abs() < 3.0, "{name}: {f} Hz, want {freq}");
                assert!((amp - 0.125).abs() < 0.01, "{name}: amplitude {amp}");
            }
        }
    }

    /// Cut short: a WAV whose data chunk states 3 s, an Ogg without its last pages.
    /// What decodes is kept, and the shortfall is named.
    #[test]
    fn truncated_files_decode_what_is_there_and_say_so() {
        let dir = tempfile::tempdir().unwrap();
        let full = wav_bytes(8000, SampleFormat::Int(16), &[sine(440.0, 0.5, 8000, 24_000)]);
        let wav = write_file(dir.path(), "cut.wav", &full[..full.len() / 2]);
        let d = decode_file(&wav).unwrap();
        assert!((d.audio.duration_seconds() - 1.5).abs() < 0.01);
        let why = d.shortfall().expect("a shortfall");
        assert!(why.contains("3.0 s") && why.contains("1.5 s"), "{why}");
        let whole = write_file(dir.path(), "whole.wav", &full);
        assert_eq!(decode_file(&whole).unwrap().shortfall(), None);

        let ogg = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/data/testdata/tone.ogg")).unwrap();
        let whole = write_file(dir.path(), "whole.ogg", &ogg);
        assert_eq!(decode_file(&whole).unwrap().shortfall(), None);
        // Without its last page (symphonia refuses a file cut mid-page outright).
        let last_page = ogg.windows(4).rposition(|w| w == b"OggS").unwrap();
        let cut = write_file(dir.path(), "cut.ogg", &ogg[..last_page]);
        let d = decode_file(&cut).unwrap_or_else(|e| panic!("cut.ogg: {e}"));
        assert!(d.audio.duration_seconds() < 1.2, "{} s", d.audio.duration_seconds());
        let why = d.shortfall().expect("a shortfall");
        assert!(why.contains("truncated") && why.contains("no end page"), "{why}");
    }

    #[test]
    fn mono_is_duplicated_and_extra_channels_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let mono = write_file(
            dir.path(),
            "mono.wav",
            &wav_bytes(8000, SampleFormat::Int(16), &[sine(440.0, 0.5, 8000, 8000)]),
        );
        let a = decode(&mono).unwrap();
        assert_eq!((a.sample_rate, a.frames()), (8000, 8000));
        assert_eq!(a.left, a.right);

        let chans: Vec<Vec<f32>> = (0..6).map(|c| vec![c as f32 / 10.0; 1000]).collect();
        let six = write_file(dir.path(), "six.wav", &wav_bytes(192_000, SampleFormat::Int(24), &chans));
        let a = decode(&six).unwrap();
        assert_eq!(a.sample_rate, 192_000);
        assert!(a.left.iter().all(|&x| x.abs() < 1e-6));
        assert!(a.right.iter().all(|&x| (x - 0.1).abs() < 1e-6));
    }

    #[test]
    fn cuts() {
        let a = StereoAudio { sample_rate: 10, left: (0..100).map(|i| i as f32).collect(), right: vec![0.0; 100] };
        assert_eq!(Cut::Head { max_seconds: 2.0 }.apply(&a).left, (0..20).map(|i| i as f32).collect::<Vec<_>>());
        assert_eq!(Cut::Head { max_seconds: 20.0 }.apply(&a).frames(), 100);
        let c = Cut::Crop { seconds: 3.0, offset: 0.5 }.apply(&a);
        assert_eq!(c.left[0], 35.0);
        assert_eq!(c.frames(), 30);
        assert_eq!(Cut::Crop { seconds: 30.0, offset: 0.9 }.apply(&a).frames(), 100);
    }
}
