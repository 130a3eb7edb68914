//! `ostinato bench --preset label-240s`: reading tempo, key and time signature from a
//! 4-minute song, on the calling thread (the analysis uses one core). The song is a
//! 48 kHz stereo 16-bit WAV the bench writes to a temporary folder (the demo
//! synthesizer's first clip, end to end). It reports seconds per song, CPU seconds,
//! and the heap's peak while analysing against what the decoded song would take:
//! the song is streamed, so the peak stays far below it.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::median;
use crate::data::synth::{self, CLIPS};
use crate::data::wav::{write_wav, SampleFormat};
use crate::label::analysis::analyse_file;
use crate::{heap, metrics, Error, Result};

/// The preset's name.
pub const LABEL_240S: &str = "label-240s";
const SONG_SECONDS: usize = 240;

/// What [`run_label`] measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LabelBenchReport {
    pub preset: String,
    pub song_seconds: f64,
    pub warmup: usize,
    /// Seconds of each timed analysis.
    pub runs_s: Vec<f64>,
    /// Median seconds per song (named as the other reports', for `bench/interleave.py`).
    pub median_s_per_step: f64,
    pub cpu_s_per_step: Option<f64>,
    /// The most heap live at once during an analysis, above what was live before it.
    pub heap_peak_bytes: Option<u64>,
    /// What the song takes decoded (f32 stereo at its rate): what streaming avoids.
    pub decoded_song_bytes: u64,
    /// What the analysis read, for a glance that it did its work.
    pub bpm: Option<u32>,
    pub keyscale: Option<String>,
    pub timesignature: Option<u32>,
}

/// Writes the song, then analyses it `warmup` times untimed and `runs` times timed.
pub fn run_label(warmup: usize, runs: usize) -> Result<LabelBenchReport> {
    if runs == 0 {
        return Err(Error::setting("steps", "bench needs at least one timed run"));
    }
    let dir = tempfile::tempdir().map_err(|e| Error::io(std::env::temp_dir(), e))?;
    let path = dir.path().join("song.wav");
    let [left, right] = CLIPS[0].render(0);
    let repeats = SONG_SECONDS / synth::SECONDS as usize;
    let song = [left.repeat(repeats), right.repeat(repeats)];
    write_wav(&path, synth::RATE, SampleFormat::Int(16), &song).map_err(|e| Error::io(&path, e))?;
    let decoded_song_bytes = (song[0].len() * 2 * std::mem::size_of::<f32>()) as u64;
    drop(song);

    let (mut times, mut cpu, mut peak) = (Vec::new(), Vec::new(), None::<u64>);
    let mut last = None;
    for i in 0..warmup + runs {
        let before = heap::live_bytes();
        heap::reset_peak();
        let cpu_start = metrics::process_cpu_seconds();
        let start = Instant::now();
        let analysis = analyse_file(&path).map_err(|e| Error::io(&path, std::io::Error::other(e)))?;
        let seconds = start.elapsed().as_secs_f64();
        if i >= warmup {
            times.push(seconds);
            if let Some((a, b)) = cpu_start.zip(metrics::process_cpu_seconds()) {
                cpu.push(b - a);
            }
            if let Some((p, b)) = heap::peak_bytes().zip(before) {
                peak = Some(peak.unwrap_or(0).max(p.saturating_sub(b)));
            }
        }
        last = Some(analysis);
    }
    let analysis = last.expect("at least one run");
    Ok(LabelBenchReport {
        preset: LABEL_240S.into(),
        song_seconds: SONG_SECONDS as f64,
        warmup,
        median_s_per_step: median(&times),
        cpu_s_per_step: (cpu.len() == runs).then(|| median(&cpu)),
        runs_s: times,
        heap_peak_bytes: peak,
        decoded_song_bytes,
        bpm: analysis.bpm.ok().map(|e| e.value),
        keyscale: analysis.keyscale.ok().map(|e| e.value),
        timesignature: analysis.timesignature.ok().map(|e| e.value),
    })
}

impl LabelBenchReport {
    pub fn table(&self) -> String {
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        let shown = |v: Option<String>| v.unwrap_or_else(|| "cannot tell".into());
        format!(
            "preset                  {}\n\
             median s per song       {:.3} ({:.0} s of audio; {} runs after {} warm-up)\n\
             CPU s per song          {}\n\
             heap peak               {} (the song decoded would take {:.1} MiB)\n\
             read                    {} BPM, {}, {}\n",
            self.preset,
            self.median_s_per_step,
            self.song_seconds,
            self.runs_s.len(),
            self.warmup,
            self.cpu_s_per_step.map_or("n/a".into(), |c| format!("{c:.3}")),
            self.heap_peak_bytes.map_or("not counted".into(), |b| format!("{:.1} MiB", mib(b))),
            mib(self.decoded_song_bytes),
            shown(self.bpm.map(|b| b.to_string())),
            shown(self.keyscale.clone()),
            shown(self.timesignature.map(|t| format!("time signature {t}"))),
        )
    }
}
