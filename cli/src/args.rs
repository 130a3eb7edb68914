//! The flags several commands share, or too many to read beside the command list:
//! the model choice, `label --captions`, `generate` and `train`.

use std::path::PathBuf;

use clap::Args;
use ostinato_engine::data::TagMode;
use ostinato_engine::device::Precision;
use ostinato_engine::generate::plan::PlanSettings;
use ostinato_engine::label::understand::labeller::UnderstandSettings;
use ostinato_engine::label::understand::sample::Sampling;
use ostinato_engine::load::source::ModelSource;
use ostinato_engine::lora::PartStrengths;
use ostinato_engine::train::fit::Fit;
use ostinato_engine::train::prompts::PreviewPrompt;

use crate::captions::CaptionArgs;

/// `label --captions` and what it uses.
#[derive(Args)]
pub struct CaptionFlags {
    /// Have ACE-Step's 5 Hz LM write each song's caption, lyrics, language and genre
    /// (kept below sidecars and edits); needs --model or --demo for the songs' codes.
    #[arg(long)]
    pub captions: bool,
    /// The 5 Hz LM folder (default: the one `ostinato models list` finds, 1.7B first).
    #[arg(long, requires = "captions")]
    pub lm: Option<PathBuf>,
    /// The ACE-Step model folder whose VAE and audio tokenizer turn songs into the LM's codes.
    #[arg(long, requires = "captions", conflicts_with = "demo")]
    pub model: Option<PathBuf>,
    /// The built-in demo model's encoder and tokenizer (random: for trying the flow).
    #[arg(long, requires = "captions")]
    pub demo: bool,
    /// Also take the LM's tempo, key and meter over the audio's readings (upstream
    /// warns its LM may invent them).
    #[arg(long, requires = "captions")]
    pub lm_metas: bool,
    /// Sampling temperature (0: always the likeliest token; default: upstream's labeller's).
    #[arg(long, requires = "captions", default_value_t = UnderstandSettings::default().sampling.temperature)]
    pub temperature: f32,
    /// Seed of each song's sampling.
    #[arg(long, requires = "captions", default_value_t = UnderstandSettings::default().seed)]
    pub seed: u64,
}

impl CaptionFlags {
    /// None without --captions.
    pub fn args(self) -> anyhow::Result<Option<CaptionArgs>> {
        if !self.captions {
            return Ok(None);
        }
        let model = match (self.model, self.demo) {
            (Some(path), _) => ModelSource::Folder { path },
            (None, true) => ModelSource::Demo,
            (None, false) => anyhow::bail!(
                "--captions needs --model DIR (the ACE-Step model whose VAE and audio tokenizer turn songs into \
                 the LM's codes) or --demo"
            ),
        };
        let defaults = UnderstandSettings::default();
        let settings = UnderstandSettings {
            sampling: Sampling { temperature: self.temperature, ..defaults.sampling },
            seed: self.seed,
            ..defaults
        };
        Ok(Some(CaptionArgs { lm: self.lm, model, take_metas: self.lm_metas, settings }))
    }
}

/// Exactly one of `--model DIR` and `--demo`.
#[derive(Args)]
#[group(required = true, multiple = false)]
pub struct ModelArg {
    /// An ACE-Step 1.5 model folder.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The built-in demo model (no download).
    #[arg(long)]
    pub demo: bool,
}

impl ModelArg {
    pub fn source(&self) -> ModelSource {
        match (&self.model, self.demo) {
            (Some(path), false) => ModelSource::Folder { path: path.clone() },
            _ => ModelSource::Demo,
        }
    }
}

#[derive(Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArg,
    /// What the music is (style, instruments, mood).
    #[arg(long)]
    pub caption: String,
    /// Lyrics (default: instrumental).
    #[arg(long, default_value = "")]
    pub lyrics: String,
    /// The lyrics' vocal language, e.g. en, zh, ja (default: unknown, as ACE-Step).
    #[arg(long)]
    pub language: Option<String>,
    /// Tempo in beats per minute, 30 to 300 (default: N/A in the prompt, as ACE-Step).
    #[arg(long)]
    pub bpm: Option<u32>,
    /// Key, e.g. "F# minor" (default: N/A).
    #[arg(long)]
    pub key: Option<String>,
    /// Time signature: 2/4, 3/4, 4/4 or 6/8 (default: N/A).
    #[arg(long)]
    pub time_signature: Option<String>,
    /// Length in seconds (at most 600).
    #[arg(long, default_value_t = 30.0)]
    pub duration: f64,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Sampling steps, at most 200 (default: 8 for turbo models, 32 for base/SFT).
    #[arg(long)]
    pub steps: Option<usize>,
    /// Timestep shift (default 3).
    #[arg(long)]
    pub shift: Option<f64>,
    /// Classifier-free guidance scale, base/SFT models only (default 7 there).
    #[arg(long)]
    pub guidance: Option<f64>,
    /// An adapter folder (PEFT's adapter_config.json + adapter_model.safetensors, or a
    /// LoKr folder). Give it several times to mix adapters: their changes add up.
    #[arg(long = "adapter")]
    pub adapters: Vec<PathBuf>,
    /// The adapter's strength, 0 to 4: 0 is the base model, 1 the adapter as trained.
    /// Once for each --adapter, in the same order, or once for all (default 1).
    #[arg(long = "adapter-scale", requires = "adapters")]
    pub adapter_scales: Vec<f64>,
    /// A strength per part of each layer on top of the adapters', e.g. cross=0.5,mlp=0
    /// (parts: self, cross, mlp; those not named stay at 1).
    #[arg(long, value_parser = parse_with::<PartStrengths>, requires = "adapters")]
    pub parts: Option<PartStrengths>,
    #[arg(long)]
    pub out: PathBuf,
    /// Also write the clean latents [frames, 64] (`latents` in a .safetensors file).
    #[arg(long)]
    pub latents_out: Option<PathBuf>,
    /// Print progress events as JSON lines instead of a progress bar.
    #[arg(long)]
    pub json: bool,
    /// Plan the song with ACE-Step's 5 Hz LM first, as its text2music "thinking" does:
    /// the LM writes the metadata (caption, tempo, key, time signature where not given)
    /// and the song's 5 Hz audio codes. DIR is the LM folder (default: the one
    /// `ostinato models list` finds).
    #[arg(long, value_name = "DIR", num_args = 0..=1)]
    pub lm: Option<Option<PathBuf>>,
    #[command(flatten)]
    pub lm_sampling: LmSamplingArgs,
}

/// How the 5 Hz LM samples its plan (upstream's text2music defaults).
#[derive(Args)]
pub struct LmSamplingArgs {
    /// The LM's sampling temperature; 0 picks the likeliest token (default 0.85).
    #[arg(long, requires = "lm")]
    pub lm_temperature: Option<f32>,
    /// The LM's classifier-free guidance scale; 1 turns it off (default 2).
    #[arg(long, requires = "lm")]
    pub lm_cfg_scale: Option<f32>,
    /// The LM's nucleus sampling: keep the likeliest tokens up to this probability;
    /// 1 keeps all (default 0.9).
    #[arg(long, requires = "lm")]
    pub lm_top_p: Option<f32>,
    /// Keep only the LM's k likeliest tokens (default: all).
    #[arg(long, requires = "lm")]
    pub lm_top_k: Option<usize>,
}

impl LmSamplingArgs {
    /// The plan's settings for the LM at `lm` (None: the one found), these over the defaults.
    pub fn settings(&self, lm: Option<PathBuf>) -> PlanSettings {
        let d = PlanSettings::default();
        PlanSettings {
            lm,
            temperature: self.lm_temperature.unwrap_or(d.temperature),
            cfg_scale: self.lm_cfg_scale.unwrap_or(d.cfg_scale),
            top_p: self.lm_top_p.or(d.top_p).filter(|&p| p < 1.0),
            top_k: self.lm_top_k.or(d.top_k),
        }
    }
}

#[derive(Args)]
pub struct TrainArgs {
    /// Folder of songs (read only, never modified).
    pub audio_dir: PathBuf,
    /// Train the built-in demo model (the default when no --model is given).
    #[arg(long, conflicts_with = "model")]
    pub demo: bool,
    /// An ACE-Step 1.5 model folder.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// A TOML run config; flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Where the run's folder is made (default: `runs` in the platform data folder).
    #[arg(long)]
    pub runs_dir: Option<PathBuf>,
    /// The label store whose labels (edited in the app, or kept by `ostinato label`)
    /// the run records and trains with (default: `labels` in the platform data folder).
    #[arg(long)]
    pub labels_dir: Option<PathBuf>,
    /// Run name (default: the date and time).
    #[arg(long)]
    pub name: Option<String>,
    /// Print engine events as JSON lines instead of a progress bar.
    #[arg(long)]
    pub json: bool,
    /// Print only the result (no progress bar or log lines).
    #[arg(long, conflicts_with = "json")]
    pub quiet: bool,
    /// Recompute each block in backward instead of keeping its activations (several
    /// times less memory, about 1.3x the time per step; the default).
    #[arg(long, overrides_with = "no_gradient_checkpointing")]
    pub gradient_checkpointing: bool,
    /// Keep every block's activations: faster, far more memory.
    #[arg(long)]
    pub no_gradient_checkpointing: bool,
    /// Encode each song once into the content-addressed latent cache and reuse it
    /// across epochs and runs (the default).
    #[arg(long, overrides_with = "no_cache")]
    pub cache: bool,
    /// Encode every song afresh each epoch (no disk used for latents).
    #[arg(long)]
    pub no_cache: bool,
    /// Passes over the dataset.
    #[arg(long, value_name = "N")]
    pub epochs: Option<u64>,
    /// Bound on optimizer updates for the whole run (the schedule spans it).
    #[arg(long, value_name = "N")]
    pub max_steps: Option<u64>,
    /// Stop, resumably, once this many updates are applied (as the Stop button would).
    #[arg(long, value_name = "N")]
    pub stop_at_step: Option<u64>,
    /// Songs per batch.
    #[arg(long, value_name = "N")]
    pub batch_size: Option<usize>,
    /// Batches whose gradients are summed into one update.
    #[arg(long, value_name = "N")]
    pub grad_accum: Option<usize>,
    /// The optimizer: adamw (the default), prodigy (learns its step size: lr then
    /// multiplies it, 1 and a constant schedule by default) or adafactor (factored
    /// second moments, no first moment); their other settings in the config file's
    /// [optimizer] table.
    #[arg(long, value_name = "NAME")]
    pub optimizer: Option<String>,
    /// Peak learning rate (for prodigy, a multiplier of the step size it learns).
    #[arg(long, value_name = "F")]
    pub lr: Option<f64>,
    /// The learning rate's shape over the run: warmup-cosine (ACE-Step's, the
    /// default), constant, linear or cosine-restarts.
    #[arg(long, value_name = "KIND")]
    pub lr_schedule: Option<String>,
    /// Warmup updates of warmup-cosine or cosine-restarts (default 100).
    #[arg(long, value_name = "N")]
    pub warmup_steps: Option<u64>,
    /// Cosine cycles of cosine-restarts, each restarting at the peak rate (default 1).
    #[arg(long, value_name = "N")]
    pub cycles: Option<u64>,
    /// The adapter: lora (low-rank B A, PEFT's; the default) or lokr (a Kronecker
    /// product, as upstream ACE-Step trains through LyCORIS; saved as its
    /// lokr_weights.safetensors). LoKr trains without dropout.
    #[arg(long, value_name = "KIND")]
    pub adapter: Option<String>,
    /// Rank (for lokr, LyCORIS's linear_dim: from half a Kronecker half's larger side
    /// up, that half is a whole matrix).
    #[arg(long, value_name = "N")]
    pub rank: Option<usize>,
    /// Alpha: the update is scaled by alpha / rank (lokr: linear_alpha, scale 1 when
    /// both Kronecker halves are whole matrices).
    #[arg(long, value_name = "F")]
    pub alpha: Option<f64>,
    /// LoRA dropout, 0 to below 1.
    #[arg(long, value_name = "F")]
    pub dropout: Option<f64>,
    /// DoRA: also train a magnitude per output row (PEFT's use_dora for lora,
    /// LyCORIS's weight decomposition for lokr).
    #[arg(long)]
    pub dora: bool,
    /// LoKr's Kronecker split: -1 for the most balanced (the default), or the factor
    /// that splits each dimension.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub factor: Option<i64>,
    /// LoKr: make the smaller Kronecker half a rank-r product too.
    #[arg(long)]
    pub decompose_both: bool,
    /// What the adapter trains, comma-separated: self (self-attention), cross
    /// (cross-attention), mlp, or module names as PEFT matches them (default:
    /// q_proj,k_proj,v_proj,o_proj, both attentions).
    #[arg(long, value_name = "LIST")]
    pub targets: Option<String>,
    /// Share of samples trained on the model's null condition (CFG dropout), 0 to 1;
    /// default: the model's (base/SFT 0.15, turbo and demo 0).
    #[arg(long)]
    pub cfg_dropout: Option<f64>,
    /// Seed of everything random in the run (order, crops, noise, dropout): the same
    /// seed and settings train the same adapter.
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// A checkpoint every N updates (a stop or crash loses at most the steps since).
    #[arg(long, value_name = "N")]
    pub save_every_steps: Option<u64>,
    /// Files of the audio folder (relative paths, comma-separated) held out for validation.
    #[arg(long, value_delimiter = ',', conflicts_with = "val_fraction")]
    pub val_files: Vec<String>,
    /// Share of the clips held out for validation (drawn from the seed), e.g. 0.1.
    #[arg(long)]
    pub val_fraction: Option<f64>,
    /// Measure the validation loss every N updates (needed with held-out clips).
    #[arg(long)]
    pub val_every_steps: Option<u64>,
    /// Finish early after K validations without a better loss.
    #[arg(long)]
    pub patience: Option<u64>,
    /// Compute precision: auto (the device's best), f32, bf16, f16, or bf16-weights
    /// (frozen weights held in bf16, computed in f32 layer by layer: half the weights'
    /// memory on the CPU). Trainable weights and optimizer state stay f32.
    #[arg(long, value_parser = parse_with::<Precision>)]
    pub precision: Option<Precision>,
    /// A trigger word or phrase joined to every song's caption, so the adapter
    /// answers to it in prompts.
    #[arg(long)]
    pub trigger: Option<String>,
    /// Where the trigger goes in each caption: prepend, append or replace.
    #[arg(long, requires = "trigger", value_name = "POSITION", value_parser = parse_with::<TagMode>)]
    pub trigger_position: Option<TagMode>,
    /// Train on windows this many seconds long, at an offset drawn from the seed each
    /// epoch (with the latent cache, windows of the whole song's cached latents).
    #[arg(long)]
    pub crop_seconds: Option<f64>,
    /// `auto`: choose gradient checkpointing, batch, precision and crop length for
    /// this machine's memory. Either way a run predicted not to fit does not start.
    #[arg(long, default_value = "off", value_parser = parse_with::<Fit>)]
    pub fit: Fit,
    /// Write preview songs every N steps into the run's previews/ folder (and of the
    /// base model before step 1, unless --preview-at-step-0 off).
    #[arg(long, value_name = "N")]
    pub preview_every_steps: Option<u64>,
    /// Length of each preview, in seconds (default 10).
    #[arg(long, value_name = "S")]
    pub preview_seconds: Option<f64>,
    /// The previews' caption (default: the first training song's caption).
    #[arg(long, value_name = "TEXT")]
    pub preview_caption: Option<String>,
    /// A preview prompt of your own; give it several times for several, each previewed
    /// at every preview step: fields `caption`, `lyrics`, `bpm`, `keyscale`,
    /// `timesignature`, `seconds`, `seed`, `steps`, `guidance`, `;` between them, e.g.
    /// "caption=[trigger], lofi piano; bpm=90; keyscale=A minor; seed=3". `[trigger]` is
    /// the run's trigger word; fields left out are the run's preview defaults.
    /// `adapter=FOLDER@STRENGTH` (once for each) mixes another run's adapter in.
    #[arg(long = "preview-prompt", value_name = "FIELDS", value_parser = parse_with::<PreviewPrompt>)]
    pub preview_prompts: Vec<PreviewPrompt>,
    /// Preview the base model before step 1, to compare with (on or off; default on).
    #[arg(long, value_name = "ON|OFF", value_parser = on_off)]
    pub preview_at_step_0: Option<bool>,
    /// Plan each preview with ACE-Step's 5 Hz LM first (its metadata and audio codes),
    /// the LM `ostinato models list` finds; the run refuses to start without one.
    #[arg(long)]
    pub preview_lm: bool,
}

pub fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(format!("expected on or off, not `{other}`")),
    }
}

pub fn parse_with<T: std::str::FromStr<Err = String>>(s: &str) -> Result<T, String> {
    s.parse()
}
