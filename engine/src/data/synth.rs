//! The demo dataset's synthesizer: six short clips (plucks, pads, drums from noise
//! bursts, bass, bells, chiptune) at different tempos and keys, with captions. The
//! clips in `assets/demo/` were written by `write_demo`; regenerate them with
//! `cargo run -p ostinato-engine --example make_demo_assets`.

use std::path::{Path, PathBuf};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::wav::{write_wav, SampleFormat};

pub const RATE: u32 = 48_000;
pub const SECONDS: f64 = 6.0;

/// A stereo buffer being rendered, with a seeded noise source.
struct Mix {
    left: Vec<f32>,
    right: Vec<f32>,
    rng: ChaCha8Rng,
}

fn midi(note: i32) -> f64 {
    440.0 * 2f64.powf((note - 69) as f64 / 12.0)
}

impl Mix {
    fn new(seed: u64) -> Self {
        let n = (SECONDS * RATE as f64) as usize;
        Self { left: vec![0.0; n], right: vec![0.0; n], rng: ChaCha8Rng::seed_from_u64(seed) }
    }

    /// Adds `voice(i)` for `seconds` from `at`, panned (-1 left .. 1 right), with a
    /// 10 ms fade at the end so cut-off notes do not click.
    fn add(&mut self, at: f64, seconds: f64, pan: f32, mut voice: impl FnMut(usize, &mut ChaCha8Rng) -> f32) {
        let start = (at * RATE as f64) as usize;
        let len = (seconds * RATE as f64) as usize;
        let fade = (RATE / 100) as f32;
        let (gl, gr) = ((1.0 - pan) * 0.5, (1.0 + pan) * 0.5);
        for i in 0..len.min(self.left.len().saturating_sub(start)) {
            let x = voice(i, &mut self.rng) * ((len - i) as f32 / fade).min(1.0);
            self.left[start + i] += gl * x;
            self.right[start + i] += gr * x;
        }
    }

    /// Karplus-Strong plucked string.
    fn pluck(&mut self, at: f64, note: i32, amp: f32, pan: f32) {
        let period = (RATE as f64 / midi(note)).round() as usize;
        let mut line: Vec<f32> = (0..period).map(|_| self.rng.random_range(-1.0..1.0)).collect();
        self.add(at, 1.5, pan, |i, _| {
            let j = i % period;
            let out = line[j];
            line[j] = 0.996 * 0.5 * (line[j] + line[(j + 1) % period]);
            amp * out
        });
    }

    /// Two detuned saws through a one-pole low-pass, slow attack and release.
    fn pad(&mut self, at: f64, seconds: f64, note: i32, amp: f32, pan: f32) {
        let f = midi(note) / RATE as f64;
        let (mut p1, mut p2, mut lp) = (0.0f64, 0.25f64, 0.0f32);
        let n = seconds * RATE as f64;
        self.add(at, seconds, pan, |i, _| {
            p1 = (p1 + f * 1.003).fract();
            p2 = (p2 + f * 0.997).fract();
            let saw = (p1 + p2 - 1.0) as f32;
            lp += 0.08 * (saw - lp);
            let t = i as f64;
            let env = (t / (0.4 * RATE as f64)).min(1.0).min((n - t) / (0.4 * RATE as f64));
            amp * env as f32 * lp
        });
    }

    /// Sine kick with a falling pitch.
    fn kick(&mut self, at: f64, amp: f32) {
        let mut phase = 0.0f64;
        self.add(at, 0.35, 0.0, |i, _| {
            let t = i as f64 / RATE as f64;
            phase += (45.0 + 110.0 * (-t * 30.0).exp()) / RATE as f64;
            amp * ((2.0 * std::f64::consts::PI * phase).sin() * (-t * 9.0).exp()) as f32
        });
    }

    /// Noise burst plus a short tone body.
    fn snare(&mut self, at: f64, amp: f32) {
        self.add(at, 0.25, 0.1, |i, rng| {
            let t = i as f64 / RATE as f64;
            let noise = rng.random_range(-1.0f32..1.0) * (-t * 22.0).exp() as f32;
            let body = ((2.0 * std::f64::consts::PI * 185.0 * t).sin() * (-t * 30.0).exp()) as f32;
            amp * (0.7 * noise + 0.5 * body)
        });
    }

    /// High-passed noise tick.
    fn hat(&mut self, at: f64, amp: f32, decay: f64) {
        let mut prev = 0.0f32;
        self.add(at, 0.15, 0.4, |i, rng| {
            let n = rng.random_range(-1.0f32..1.0);
            let hp = n - prev;
            prev = n;
            amp * 0.5 * hp * (-(i as f64) / RATE as f64 * decay).exp() as f32
        });
    }

    /// Music-box bell: inharmonic partials with their own decays.
    fn bell(&mut self, at: f64, note: i32, amp: f32, pan: f32) {
        let f = midi(note);
        self.add(at, 2.0, pan, |i, _| {
            let t = i as f64 / RATE as f64;
            let w = 2.0 * std::f64::consts::PI * f * t;
            let x = w.sin() * (-t * 2.5).exp()
                + 0.4 * (2.76 * w).sin() * (-t * 6.0).exp()
                + 0.2 * (5.4 * w).sin() * (-t * 12.0).exp();
            amp * x as f32
        });
    }

    /// Square (`duty` 0.5) or triangle (`duty` None) with a short decay.
    fn chip(&mut self, at: f64, seconds: f64, note: i32, amp: f32, duty: Option<f64>, pan: f32) {
        let f = midi(note) / RATE as f64;
        let mut p = 0.0f64;
        self.add(at, seconds, pan, |i, _| {
            p = (p + f).fract();
            let x = match duty {
                Some(d) => {
                    if p < d {
                        1.0
                    } else {
                        -1.0
                    }
                }
                None => 4.0 * (p - 0.5).abs() - 1.0,
            };
            let env = (-(i as f64) / RATE as f64 * 3.0).exp();
            amp * (x * env) as f32
        });
    }

    /// Saw bass through a one-pole low-pass, plucky envelope.
    fn bass(&mut self, at: f64, seconds: f64, note: i32, amp: f32) {
        let f = midi(note) / RATE as f64;
        let (mut p, mut lp) = (0.0f64, 0.0f32);
        self.add(at, seconds, 0.0, |i, _| {
            p = (p + f).fract();
            lp += 0.05 * ((2.0 * p - 1.0) as f32 - lp);
            amp * lp * (-(i as f64) / RATE as f64 * 4.0).exp() as f32
        });
    }

    /// Scaled to a 0.8 peak.
    fn finish(self) -> [Vec<f32>; 2] {
        let peak = self.left.iter().chain(&self.right).fold(1e-9f32, |m, x| m.max(x.abs()));
        let g = 0.8 / peak;
        [self.left, self.right].map(|c| c.into_iter().map(|x| x * g).collect())
    }
}

/// One demo clip: a file name, its caption and metas, and how to play it.
pub struct Clip {
    pub name: &'static str,
    pub caption: &'static str,
    pub bpm: u32,
    pub keyscale: &'static str,
    pub genre: &'static str,
    play: fn(&mut Mix, f64),
}

fn drums(m: &mut Mix, beat: f64, snare: bool) {
    let beats = (SECONDS / beat) as usize;
    for b in 0..beats {
        let t = b as f64 * beat;
        if b % 2 == 0 {
            m.kick(t, 0.9);
        } else if snare {
            m.snare(t, 0.6);
        }
        m.hat(t + beat / 2.0, 0.3, 40.0);
    }
}

pub const CLIPS: [Clip; 6] = [
    Clip {
        name: "pluck_arpeggio_c_major",
        caption: "bright plucked synth arpeggio over a steady kick, electronic, uplifting, instrumental",
        bpm: 120,
        keyscale: "C major",
        genre: "electronic",
        play: |m, beat| {
            let chords = [[60, 64, 67, 72], [57, 60, 64, 69], [53, 57, 60, 65]];
            for (bar, chord) in chords.iter().enumerate() {
                for s in 0..16 {
                    let t = (bar * 4) as f64 * beat + s as f64 * beat / 4.0;
                    m.pluck(t, chord[s % 4], 0.5, if s % 2 == 0 { -0.3 } else { 0.3 });
                }
                for b in 0..4 {
                    m.kick((bar * 4 + b) as f64 * beat, 0.7);
                }
            }
        },
    },
    Clip {
        name: "ambient_pad_a_minor",
        caption: "slow warm ambient synth pads, dreamy, soft, wide stereo, instrumental",
        bpm: 70,
        keyscale: "A minor",
        genre: "ambient",
        play: |m, _| {
            let chords = [[45, 57, 60, 64], [41, 57, 60, 65], [48, 55, 60, 64]];
            for (i, chord) in chords.iter().enumerate() {
                for (j, &n) in chord.iter().enumerate() {
                    m.pad(i as f64 * 2.0, 2.6, n, 0.3, if j % 2 == 0 { -0.6 } else { 0.6 });
                }
            }
        },
    },
    Clip {
        name: "drum_groove_128",
        caption: "punchy drum machine groove, kick, snare and hi-hats, dance, instrumental",
        bpm: 128,
        keyscale: "C major",
        genre: "dance",
        play: |m, beat| {
            drums(m, beat, true);
            let beats = (SECONDS / beat) as usize;
            for b in 0..beats {
                m.hat(b as f64 * beat + beat * 0.75, 0.15, 60.0);
            }
        },
    },
    Clip {
        name: "funk_bass_e_minor",
        caption: "funky syncopated synth bass with tight drums, groovy, instrumental",
        bpm: 100,
        keyscale: "E minor",
        genre: "funk",
        play: |m, beat| {
            drums(m, beat, true);
            let riff = [40, 40, 52, 40, 43, 45, 47, 38];
            let steps = (SECONDS / (beat / 2.0)) as usize;
            for s in 0..steps {
                if s % 8 != 3 {
                    m.bass(s as f64 * beat / 2.0, beat / 2.0, riff[s % 8], 0.8);
                }
            }
        },
    },
    Clip {
        name: "music_box_f_major",
        caption: "gentle music box lullaby melody, bells, calm, sweet, instrumental",
        bpm: 90,
        keyscale: "F major",
        genre: "lullaby",
        play: |m, beat| {
            let tune = [77, 76, 74, 72, 74, 76, 77, 72, 69, 70, 72, 65];
            for (i, &n) in tune.iter().enumerate() {
                m.bell(i as f64 * beat / 1.5, n, 0.4, ((i % 3) as f32 - 1.0) * 0.4);
                if i % 4 == 0 {
                    m.bell(i as f64 * beat / 1.5, n - 24, 0.25, 0.0);
                }
            }
        },
    },
    Clip {
        name: "chiptune_g_major",
        caption: "fast 8-bit chiptune with square wave lead, triangle bass and noise hats, video game, instrumental",
        bpm: 140,
        keyscale: "G major",
        genre: "chiptune",
        play: |m, beat| {
            let lead = [67, 71, 74, 79, 78, 74, 71, 74, 76, 72, 69, 72, 74, 71, 67, 62];
            let step = beat / 2.0;
            let steps = (SECONDS / step) as usize;
            for s in 0..steps {
                let t = s as f64 * step;
                m.chip(t, step, lead[s % 16], 0.25, Some(0.5), 0.2);
                if s % 2 == 0 {
                    m.chip(t, beat, [43, 43, 40, 38][(s / 8) % 4], 0.5, None, 0.0);
                }
                m.hat(t, 0.2, 80.0);
            }
        },
    },
];

impl Clip {
    /// The clip's two channels at `RATE`, `SECONDS` long. Deterministic.
    pub fn render(&self, seed: u64) -> [Vec<f32>; 2] {
        let mut m = Mix::new(seed);
        (self.play)(&mut m, 60.0 / self.bpm as f64);
        m.finish()
    }

    /// The `<name>.json` sidecar with the clip's metas.
    pub fn metas_json(&self) -> String {
        format!(
            "{{\"bpm\": {}, \"keyscale\": \"{}\", \"timesignature\": \"4\", \"genre\": \"{}\"}}\n",
            self.bpm, self.keyscale, self.genre
        )
    }
}

/// Writes every clip as 16-bit stereo WAV with `.caption.txt` and `.json` sidecars.
pub fn write_demo(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    for (seed, clip) in CLIPS.iter().enumerate() {
        let wav = dir.join(format!("{}.wav", clip.name));
        write_wav(&wav, RATE, SampleFormat::Int(16), &clip.render(seed as u64))?;
        std::fs::write(dir.join(format!("{}.caption.txt", clip.name)), format!("{}\n", clip.caption))?;
        std::fs::write(dir.join(format!("{}.json", clip.name)), clip.metas_json())?;
        written.push(wav);
    }
    Ok(written)
}

/// The committed demo folder, `assets/demo` at the repository root.
pub fn demo_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/demo")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::audio::decode;
    use crate::data::sidecar::Sidecars;

    #[test]
    fn committed_demo_clips_are_what_the_generator_makes() {
        let dir = demo_dir();
        let mut total = 0;
        for (seed, clip) in CLIPS.iter().enumerate() {
            let path = dir.join(format!("{}.wav", clip.name));
            total += std::fs::metadata(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).len();
            let a = decode(&path).unwrap();
            assert_eq!((a.sample_rate, a.frames()), (RATE, (SECONDS * RATE as f64) as usize));
            // Within 2 LSB: float rounding may differ across platforms, the music not.
            let [l, r] = clip.render(seed as u64);
            let err =
                a.left.iter().zip(&l).chain(a.right.iter().zip(&r)).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            assert!(err <= 2.0 / 32767.0 + 1e-6, "{}: differs from the generator by {err}", clip.name);
            let meta = Sidecars::new().read(&path, &mut Vec::new());
            assert_eq!(meta.caption, clip.caption);
            assert_eq!(meta.bpm, Some(clip.bpm));
        }
        assert!(total < 8 << 20, "demo clips take {total} bytes");
    }

    #[test]
    fn clips_differ_and_are_loud_enough() {
        let a = CLIPS[0].render(0);
        let b = CLIPS[1].render(1);
        assert_ne!(a[0], b[0]);
        for c in [&a, &b] {
            let peak = c[0].iter().chain(&c[1]).fold(0.0f32, |m, x| m.max(x.abs()));
            assert!((peak - 0.8).abs() < 1e-4);
        }
    }
}
