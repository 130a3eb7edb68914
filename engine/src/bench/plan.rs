//! `ostinato bench --preset plan-0.6b`: the 5 Hz LM (0.6B, random weights) planning one
//! 30 s song as `generate --lm` decodes it: both phases with classifier-free guidance
//! (the conditional and unconditional sequences, greedy on the guided scores), the
//! metadata phase reading every LM-head row but the audio codes, the codes phase only
//! the codes and the end token. Token counts as a real request's: see the constants.

use std::time::Instant;

use candle_core::Device;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::lm::LmPreset;
use super::{device_name, median};
use crate::codec::CausalLm;
use crate::device::Precision;
use crate::label::understand::decode::{NextLogits, Rows};
use crate::label::understand::guided::Guided;
use crate::label::understand::prompt::AUDIO_CODES;
use crate::label::understand::sample::argmax;
use crate::label::understand::steps::LmSteps;
use crate::tensor_io::RandomTensors;
use crate::{Error, Result};

pub const PLAN_PRESET: &str = "plan-0.6b";
/// The metadata prompt (caption and a verse of lyrics) and its unconditional twin
/// (the lyrics alone), and the metadata the LM writes.
pub const METADATA_PROMPT: (usize, usize) = (160, 130);
pub const METADATA_TOKENS: usize = 60;
/// The codes prompt (the metadata as the think block) and its twin (an empty one); a
/// 30 s song's 150 codes and the end token.
pub const CODES_PROMPT: (usize, usize) = (230, 200);
pub const CODES_TOKENS: usize = 151;
const AUDIO_CODE_0: u32 = 151_669;
const EOS: u32 = 151_645;
const CFG_SCALE: f32 = 2.0;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PlanBenchReport {
    pub preset: String,
    pub device: String,
    pub threads: usize,
    pub precision: String,
    pub metadata_prompt: (usize, usize),
    pub metadata_tokens: usize,
    pub codes_prompt: (usize, usize),
    pub codes_tokens: usize,
    pub cfg_scale: f32,
    pub warmup: usize,
    pub runs_s: Vec<f64>,
    pub median_s_per_step: f64,
    pub metadata_s: f64,
    pub codes_s: f64,
    pub peak_rss_bytes: u64,
}

pub fn run_plan(precision: Precision, warmup: usize, runs: usize, device: &Device) -> Result<PlanBenchReport> {
    if runs == 0 {
        return Err(Error::setting("steps", "bench needs at least one timed run"));
    }
    let cfg = LmPreset::Lm0_6b.config();
    let lm = CausalLm::from_source(&cfg, &RandomTensors { seed: 0x5A, device: device.clone() }, precision)?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    let mut prompt = |n: usize| -> Vec<u32> { (0..n).map(|_| rng.random_range(0..AUDIO_CODE_0)).collect() };
    let prompts =
        [(prompt(METADATA_PROMPT.0), prompt(METADATA_PROMPT.1)), (prompt(CODES_PROMPT.0), prompt(CODES_PROMPT.1))];
    let codes = AUDIO_CODE_0..AUDIO_CODE_0 + AUDIO_CODES;
    let not_codes = [codes.clone()];
    let codes_and_end = [EOS..EOS + 1, codes];
    let phase = |(cond, uncond): &(Vec<u32>, Vec<u32>), tokens: usize, rows: &Rows| -> Result<f64> {
        let start = Instant::now();
        let budget = tokens;
        let mut guided = Guided::new(LmSteps::new(&lm, budget), LmSteps::new(&lm, budget), uncond.clone(), CFG_SCALE)?;
        let mut scores = guided.prefill(cond, rows)?;
        for _ in 1..tokens {
            let token = argmax(&scores).unwrap_or(0);
            scores = guided.step(token, rows)?;
        }
        Ok(start.elapsed().as_secs_f64())
    };
    let mut parts = Vec::new();
    for i in 0..warmup + runs {
        let metadata = phase(&prompts[0], METADATA_TOKENS, &Rows::AllBut(&not_codes))?;
        let codes = phase(&prompts[1], CODES_TOKENS, &Rows::Runs(&codes_and_end))?;
        if i >= warmup {
            parts.push((metadata, codes));
        }
    }
    let times: Vec<f64> = parts.iter().map(|(m, c)| m + c).collect();
    Ok(PlanBenchReport {
        preset: PLAN_PRESET.into(),
        device: device_name(device).to_string(),
        threads: candle_core::utils::get_num_threads(),
        precision: format!("weights {:?}, compute {:?}", lm.held_dtype(), lm.compute_dtype()).to_lowercase(),
        metadata_prompt: METADATA_PROMPT,
        metadata_tokens: METADATA_TOKENS,
        codes_prompt: CODES_PROMPT,
        codes_tokens: CODES_TOKENS,
        cfg_scale: CFG_SCALE,
        warmup,
        median_s_per_step: median(&times),
        metadata_s: median(&parts.iter().map(|p| p.0).collect::<Vec<_>>()),
        codes_s: median(&parts.iter().map(|p| p.1).collect::<Vec<_>>()),
        runs_s: times,
        peak_rss_bytes: crate::metrics::peak_rss_bytes().unwrap_or(0),
    })
}

impl PlanBenchReport {
    pub fn table(&self) -> String {
        format!(
            "preset                  {}\n\
             device / threads        {} / {}\n\
             precision               {}\n\
             metadata                prompts {:?}, {} tokens (CFG {})\n\
             codes                   prompts {:?}, {} tokens\n\
             median s per song       {:.3} (metadata {:.3}, codes {:.3}; {} runs after {} warm-up)\n",
            self.preset,
            self.device,
            self.threads,
            self.precision,
            self.metadata_prompt,
            self.metadata_tokens,
            self.cfg_scale,
            self.codes_prompt,
            self.codes_tokens,
            self.median_s_per_step,
            self.metadata_s,
            self.codes_s,
            self.runs_s.len(),
            self.warmup,
        )
    }
}
