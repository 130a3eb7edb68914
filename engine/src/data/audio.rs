//! Decode any supported file to f32 stereo (symphonia), resample to the model's rate
//! (rubato, band-limited FFT resampler), and cut to a maximum length or a crop.
//!
//! Decoding keeps only the part of a song training uses (the cut or the crop) and
//! stops there: a ten-hour file costs no more memory than a 240 s one. The file's
//! length then comes from its header, or from counting its packets without decoding.

use std::ops::RangeInclusive;
use std::path::Path;

use rubato::{FftFixedIn, Resampler};
use symphonia::core::audio::SampleBuffer;
use symphonia::core::codecs::{Decoder, DecoderOptions, CODEC_TYPE_NULL};
use symphonia::core::errors::Error as SymError;
use symphonia::core::formats::{FormatOptions, FormatReader, Packet};
use symphonia::core::io::MediaSourceStream;
use symphonia::core::meta::MetadataOptions;
use symphonia::core::probe::Hint;
use symphonia::core::units::TimeBase;

use super::guard::guarded;
use super::regular::open_regular;
use crate::codec::StereoAudio;

/// Below this peak a file counts as silent (-80 dBFS): nothing to learn from.
pub const SILENCE_PEAK: f32 = 1e-4;
/// Shorter files are not music to learn from.
pub const MIN_SECONDS: f64 = 1.0;
/// Sample rates a song may have: from 8 kHz (telephone audio, the least that still
/// carries a tune) to 384 kHz (the most any recording format or converter uses).
/// Outside it the header is damaged: a "1 Hz" song of 240 000 samples would be
/// trained as 66 hours of audio, and 0 Hz has no time at all.
pub const SAMPLE_RATES: RangeInclusive<u32> = 8_000..=384_000;
/// Decode errors tolerated before a file counts as corrupt (a stray bad frame in a
/// long MP3 is common and harmless).
const MAX_DECODE_ERRORS: usize = 3;
/// Audio missing between two packets beyond this is damage, not a skipped bad frame.
const MAX_GAP_SECONDS: f64 = 1.0;

/// The part of a file a decode kept, and how long the whole file is.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    /// The part asked for (the cut or the crop), at the file's own rate.
    pub audio: StereoAudio,
    /// Frames in the whole file: decoded to its end, or, when decoding stopped at the
    /// cut, as its header states or as its packets count.
    pub frames_in_file: u64,
    /// Frames the header promises (`n_frames`), at the audio's own rate.
    pub stated_frames: Option<u64>,
    /// An Ogg stream whose end-of-stream page is missing: the file was cut short,
    /// though how much is missing is unknown (an Ogg header states no length; the
    /// last page's position does).
    pub unterminated: bool,
}

impl Decoded {
    /// Seconds in the whole file (not only the part kept).
    pub fn seconds_in_file(&self) -> f64 {
        self.frames_in_file as f64 / f64::from(self.audio.sample_rate)
    }

    /// Why the file looks cut short, when far fewer frames are found than the header
    /// states: more than 1 s or 1% missing, whichever is more. Codec padding and
    /// estimated lengths differ by milliseconds; a cut download loses far more.
    pub fn shortfall(&self) -> Option<String> {
        if self.unterminated {
            return Some(format!(
                "truncated: the Ogg stream has no end page, only {:.1} s decode",
                self.seconds_in_file()
            ));
        }
        let stated = self.stated_frames?;
        let found = self.frames_in_file;
        let rate = self.audio.sample_rate;
        let tolerance = (stated / 100).max(u64::from(rate));
        (found.saturating_add(tolerance) < stated).then(|| {
            format!(
                "truncated or damaged: the header states {:.1} s, only {:.1} s decode",
                stated as f64 / f64::from(rate),
                self.seconds_in_file()
            )
        })
    }
}

/// Decodes a whole file to stereo at its own sample rate: for files of known, modest
/// length (the app's own previews and songs). A song of the dataset is decoded with
/// `decode_file` and its cut.
pub fn decode(path: &Path) -> Result<StereoAudio, String> {
    decode_file(path, Cut::Head { max_seconds: f64::INFINITY }).map(|d| d.audio)
}

/// Decodes the part of a file `cut` keeps, to stereo at the file's own sample rate,
/// with the whole file's length. Mono is duplicated to both channels; with more than
/// two channels the first two (front left/right in every standard layout) are kept.
/// A file that ends early keeps what decodes (see `Decoded::shortfall`). The error is
/// a reason for the user, without the path; a decoder that panics on the file gives
/// one too.
pub fn decode_file(path: &Path, cut: Cut) -> Result<Decoded, String> {
    let (mut left, mut right) = (Vec::new(), Vec::new());
    let (sample_rate, length) = read(path, cut, &mut |samples, channels, _| {
        for frame in samples.chunks_exact(channels) {
            left.push(frame[0]);
            right.push(frame[usize::from(channels > 1)]);
        }
    })?;
    Ok(Decoded {
        audio: StereoAudio { sample_rate, left, right },
        frames_in_file: length.frames_in_file,
        stated_frames: length.stated_frames,
        unterminated: length.unterminated,
    })
}

/// Streams the part of a file `cut` keeps to `sink`, a block at a time, as mono (the
/// mean of the first two channels) with the file's sample rate: for analyses that
/// keep no more than a block in memory however long the song. Returns the file's
/// length in seconds (as `decode_file` finds it).
pub fn stream_mono(path: &Path, cut: Cut, sink: &mut dyn FnMut(u32, &[f32])) -> Result<f64, String> {
    let mut mono = Vec::new();
    let (sample_rate, length) = read(path, cut, &mut |samples, channels, rate| {
        mono.clear();
        mono.extend(samples.chunks_exact(channels).map(|f| 0.5 * (f[0] + f[usize::from(channels > 1)])));
        sink(rate, &mono);
    })?;
    Ok(length.frames_in_file as f64 / f64::from(sample_rate))
}

/// How long a file is, as reading it found.
struct Length {
    frames_in_file: u64,
    stated_frames: Option<u64>,
    unterminated: bool,
}

/// Reads the frames `cut` keeps into `sink` (interleaved samples, channel count,
/// sample rate), and the file's length; a panic in the decoder is the file's error.
fn read(path: &Path, cut: Cut, sink: &mut dyn FnMut(&[f32], usize, u32)) -> Result<(u32, Length), String> {
    guarded(|| {
        let mut reader = Reader::open(path)?;
        let rate = reader.sample_rate;
        // A crop's place depends on the length: the header's, else a count first.
        let frames_in_file = match (cut, reader.stated_frames) {
            (Cut::Crop { .. }, None) => Some(Reader::open(path)?.count_to_end()?),
            (Cut::Crop { .. }, stated) => stated,
            (Cut::Head { .. }, _) => None,
        };
        let window = cut.window(rate, frames_in_file.unwrap_or(u64::MAX));
        reader.stream(window, sink)?;
        let frames_in_file = match (reader.ended, frames_in_file.or(reader.stated_frames)) {
            (true, _) => reader.position,
            (false, Some(known)) => known,
            (false, None) => reader.count_to_end()?,
        };
        let length = Length {
            frames_in_file,
            stated_frames: reader.stated_frames,
            // symphonia states an Ogg stream's length only once it found the last page.
            unterminated: reader.stated_frames.is_none() && is_ogg(path),
        };
        Ok((rate, length))
    })
}

/// A file being read: its audio track, where reading stands.
struct Reader {
    format: Box<dyn FormatReader>,
    decoder: Box<dyn Decoder>,
    track_id: u32,
    time_base: Option<TimeBase>,
    sample_rate: u32,
    stated_frames: Option<u64>,
    /// Frames read so far (decoded, or counted from packet durations).
    position: u64,
    /// The stream's end was reached.
    ended: bool,
    decode_errors: usize,
    first_packet_s: Option<f64>,
}

impl Reader {
    fn open(path: &Path) -> Result<Self, String> {
        let file = open_regular(path).map_err(|e| format!("cannot open: {e}"))?;
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
        let format = probed.format;
        let track = format.tracks().iter().find(|t| t.codec_params.codec != CODEC_TYPE_NULL).ok_or("no audio track")?;
        let params = &track.codec_params;
        let sample_rate = params.sample_rate.ok_or("unknown sample rate")?;
        check_rate(sample_rate)?;
        let decoder = symphonia::default::get_codecs()
            .make(params, &DecoderOptions::default())
            .map_err(|e| format!("unsupported codec ({e})"))?;
        Ok(Reader {
            track_id: track.id,
            time_base: params.time_base,
            sample_rate,
            stated_frames: params.n_frames,
            format,
            decoder,
            position: 0,
            ended: false,
            decode_errors: 0,
            first_packet_s: None,
        })
    }

    /// The next packet of the audio track; None at the end of the stream.
    fn next_packet(&mut self) -> Result<Option<Packet>, String> {
        loop {
            let packet = match self.format.next_packet() {
                Ok(p) => p,
                Err(SymError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
                Err(SymError::ResetRequired) => break,
                Err(e) => return Err(format!("corrupt audio data ({e})")),
            };
            if packet.track_id() != self.track_id {
                continue;
            }
            if let Some(tb) = self.time_base {
                let t = tb.calc_time(packet.ts());
                let at = t.seconds as f64 + t.frac;
                let read_s = self.position as f64 / f64::from(self.sample_rate);
                let gap = at - *self.first_packet_s.get_or_insert(at) - read_s;
                // The reader resynced over damage: audio is missing in the middle, and
                // what decodes is not the song.
                if gap > MAX_GAP_SECONDS {
                    return Err(format!("corrupt audio data ({gap:.1} s missing after {read_s:.1} s)"));
                }
            }
            return Ok(Some(packet));
        }
        self.ended = true;
        Ok(None)
    }

    /// Decodes the frames `window` (from the file's start) into `sink`, dropping those
    /// before it and stopping at its end (or the file's).
    fn stream(&mut self, window: std::ops::Range<u64>, sink: &mut dyn FnMut(&[f32], usize, u32)) -> Result<(), String> {
        let mut buf: Option<SampleBuffer<f32>> = None;
        while self.position < window.end {
            let Some(packet) = self.next_packet()? else { break };
            let decoded = match self.decoder.decode(&packet) {
                Ok(d) => d,
                Err(SymError::DecodeError(e)) => {
                    self.decode_errors += 1;
                    if self.decode_errors > MAX_DECODE_ERRORS {
                        return Err(format!("corrupt audio data ({e})"));
                    }
                    continue;
                }
                Err(SymError::IoError(_)) => {
                    self.ended = true;
                    break;
                }
                Err(e) => return Err(format!("cannot decode ({e})")),
            };
            let spec = *decoded.spec();
            if spec.rate != self.sample_rate {
                return Err(format!("the sample rate changes from {} Hz to {} Hz", self.sample_rate, spec.rate));
            }
            let channels = spec.channels.count();
            if channels == 0 {
                return Err("audio has no channels".into());
            }
            let frames = decoded.frames() as u64;
            let (first, last) = (self.position, self.position + frames);
            self.position = last;
            if last <= window.start {
                continue;
            }
            let buf = match &mut buf {
                Some(b) if b.capacity() >= decoded.capacity() * channels => b,
                _ => buf.insert(SampleBuffer::new(decoded.capacity() as u64, spec)),
            };
            buf.copy_interleaved_ref(decoded);
            let keep = window.start.saturating_sub(first) as usize..(window.end.min(last) - first) as usize;
            sink(&buf.samples()[keep.start * channels..keep.end * channels], channels, self.sample_rate);
        }
        Ok(())
    }

    /// Reads on to the end without decoding, counting frames from the packets'
    /// durations: the file's length, for a file whose header does not state it.
    fn count_to_end(&mut self) -> Result<u64, String> {
        while let Some(packet) = self.next_packet()? {
            self.position += self.frames_of(packet.dur);
        }
        Ok(self.position)
    }

    /// A packet duration (in the track's time base) in frames.
    fn frames_of(&self, dur: u64) -> u64 {
        match self.time_base {
            Some(tb) => {
                let frames =
                    u128::from(dur) * u128::from(tb.numer) * u128::from(self.sample_rate) / u128::from(tb.denom);
                u64::try_from(frames).unwrap_or(u64::MAX)
            }
            None => dur,
        }
    }
}

/// A sample rate outside `SAMPLE_RATES` as a reason.
fn check_rate(rate: u32) -> Result<(), String> {
    match SAMPLE_RATES.contains(&rate) {
        true => Ok(()),
        false => Err(format!(
            "sample rate {rate} Hz is not one audio uses (from {} to {} Hz): a damaged header?",
            SAMPLE_RATES.start(),
            SAMPLE_RATES.end()
        )),
    }
}

/// Whether the file is an Ogg stream (it starts with a page's "OggS").
fn is_ogg(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    let read = open_regular(path).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic));
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

    /// The frames `[start, end)` the cut keeps of a song of `frames` frames at `rate`
    /// (for a head cut, `frames` may be unknown: `u64::MAX`).
    pub fn window(&self, rate: u32, frames: u64) -> std::ops::Range<u64> {
        let rate = f64::from(rate);
        // Saturating casts: an infinite cut is the whole file.
        match *self {
            Cut::Head { max_seconds } => 0..((max_seconds * rate) as u64).min(frames),
            Cut::Crop { seconds, offset } => {
                let len = ((seconds * rate) as u64).min(frames);
                let room = frames - len;
                let start = (room as f64 * offset.clamp(0.0, 1.0)).round() as u64;
                start..start + len
            }
        }
    }
}

#[cfg(test)]
mod tests;
