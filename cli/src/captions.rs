//! `label --captions`: each song's caption, lyrics, language and genre written by
//! ACE-Step's 5 Hz LM (its "understand" mode) and kept in the label store; the LM's
//! tempo, key and meter shown, and taken only with `--lm-metas`.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::Context;
use ostinato_engine::cancel::Cancel;
use ostinato_engine::data::Field;
use ostinato_engine::label::store::{Found, LabelStore};
use ostinato_engine::label::understand::labeller::{Labelled, LmLabeller, Progress, UnderstandSettings};
use ostinato_engine::label::{keep_understood, ANALYSED, UNDERSTOOD};
use ostinato_engine::load::catalog::LmVariant;
use ostinato_engine::load::discover::{find_lms, preferred_lm};
use ostinato_engine::load::places::ModelPlaces;
use ostinato_engine::load::source::ModelSource;
use serde_json::{json, Value};

/// What `--captions` was asked.
pub struct CaptionArgs {
    /// The LM folder; None: the one found (`preferred_lm`).
    pub lm: Option<PathBuf>,
    pub model: ModelSource,
    pub take_metas: bool,
    pub settings: UnderstandSettings,
}

/// One song's outcome: what the LM wrote, or why it could not (the song keeps its labels).
pub type Captioned = Result<Labelled, String>;

/// The loaded LM with what it was asked; dropped, and its memory freed, with the labelling.
pub struct Captioner {
    labeller: LmLabeller,
    take_metas: bool,
    cancel: Cancel,
}

impl Captioner {
    pub fn load(args: CaptionArgs, cancel: Cancel) -> anyhow::Result<Self> {
        let lm = match args.lm {
            Some(dir) => dir,
            None => found_lm()?,
        };
        let device = ostinato_engine::device::select(false)?;
        eprintln!("loading ACE-Step's LM from {} on {} ({})", lm.display(), device.name, device.reason);
        let labeller = LmLabeller::load(&lm, &args.model, &device.device, args.settings)?;
        Ok(Self { labeller, take_metas: args.take_metas, cancel })
    }

    /// Writes the song's labels with the LM and keeps them. Err only for what stops the
    /// whole labelling (a cancel, a store that cannot be written).
    pub fn caption(&self, store: &LabelStore, path: &Path, found: &mut Found, name: &str) -> anyhow::Result<Captioned> {
        let counting = std::io::stderr().is_terminal();
        let mut show = |p: Progress| {
            if counting {
                match p {
                    Progress::Listening { seconds, of } => {
                        eprint!("\r{name}: listening, {seconds:.0}/{of:.0} s\x1b[K")
                    }
                    Progress::Writing { tokens, budget } => {
                        eprint!("\r{name}: the LM writes, {tokens} tokens (at most {budget})\x1b[K")
                    }
                }
            }
        };
        let labelled = self.labeller.understand(path, &self.cancel, &mut show);
        if counting {
            eprint!("\r\x1b[K");
        }
        let labelled = match labelled {
            Ok(l) => l,
            Err(ostinato_engine::Error::Cancelled) => return Err(ostinato_engine::Error::Cancelled.into()),
            Err(e) => return Ok(Err(e.to_string())),
        };
        let mut saved = found.saved.clone();
        keep_understood(&mut saved, &labelled.labels, self.take_metas);
        store
            .save(path, &found.hash, &saved)
            .with_context(|| format!("cannot keep the labels of {}", path.display()))?;
        found.saved = saved;
        found.stale = false;
        Ok(Ok(labelled))
    }

    pub fn takes_metas(&self) -> bool {
        self.take_metas
    }
}

/// The LM found where models are looked for, or how to get one.
fn found_lm() -> anyhow::Result<PathBuf> {
    let found = find_lms(&ModelPlaces::from_env()?);
    if let Some(lm) = preferred_lm(&found) {
        return Ok(lm.path.clone());
    }
    let default = LmVariant::DEFAULT;
    let mut why = format!(
        "no complete 5 Hz LM found: `ostinato models download {}` fetches ACE-Step's ({}), or give --lm DIR",
        default.name(),
        default.approx_size()
    );
    for lm in found {
        why.push_str(&format!("\n  {}: {}", lm.path.display(), lm.problems.join("; ")));
    }
    anyhow::bail!(why)
}

/// The LM's lines under a song's row.
pub fn print_captioned(lm: &Captioned, takes_metas: bool) {
    let l = match lm {
        Ok(l) => l,
        Err(why) => return println!("    ACE-Step's LM: {why} (the song keeps its labels)"),
    };
    let value = |f: Field| l.labels.get(f).unwrap_or("?");
    println!("    caption (ACE-Step's LM): {}", value(Field::Caption));
    let lyrics = l.labels.get(Field::Lyrics).map_or(0, |t| t.lines().count());
    println!("    genre: {}   language: {}   lyrics: {lyrics} line(s)", value(Field::Genre), value(Field::Language));
    let metas: Vec<_> = ANALYSED.iter().map(|&f| value(f)).collect();
    let taken = if takes_metas { "taken" } else { "not taken: --lm-metas takes them" };
    println!("    the LM's tempo / key / meter: {} ({taken})", metas.join(" / "));
    for (field, value, why) in &l.refused {
        println!("    the LM's {field} `{value}` is not kept: {why}");
    }
}

/// The LM's part of a song's JSON line.
pub fn captioned_json(lm: &Captioned) -> Value {
    match lm {
        Ok(l) => {
            let fields: serde_json::Map<_, _> =
                UNDERSTOOD.iter().chain(&ANALYSED).map(|f| (f.name().to_string(), json!(l.labels.get(*f)))).collect();
            let refused: Vec<_> =
                l.refused.iter().map(|(f, v, why)| json!({"field": f, "value": v, "why": why})).collect();
            json!({
                "fields": fields,
                "refused": refused,
                "duration": l.duration,
                "codes": l.codes,
                "tokens": l.tokens,
            })
        }
        Err(why) => json!({"error": why}),
    }
}
