//! Songs planned by the 5 Hz LM, end to end on the committed tiny fixtures (the LM of
//! `tests/fixtures/lm_tiny`, the real-layout model of `tests/fixtures/real`): the plan's
//! metadata fills only what the user left open, its codes condition the DiT through the
//! checkpoint's detokenizer, and an A/B pair is planned once for both sides.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use ostinato_engine::cancel::Cancel;
use ostinato_engine::generate::plan::PlanSettings;
use ostinato_engine::generate::planned::{load_planner, plan_song};
use ostinato_engine::generate::{GenerateEvent, GenerateSpec, Generator};
use ostinato_engine::load::folder::ModelFolder;
use ostinato_engine::load::source::ModelSource;
use ostinato_engine::lora::{LoraAdapter, LoraConfig};
use ostinato_engine::model::DitModel;
use ostinato_engine::train::ab::{generate_pair_for_run, new_pair_dir, AbVoice, PairRequest, Side};
use ostinato_engine::train::config::RunConfig;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn model() -> PathBuf {
    fixtures().join("real/model")
}

/// Greedy planning with the tiny LM: the same plan every time.
fn lm() -> PlanSettings {
    PlanSettings {
        lm: Some(fixtures().join("lm_tiny/acestep-5Hz-lm-tiny")),
        temperature: 0.0,
        top_p: None,
        ..PlanSettings::default()
    }
}

fn song() -> GenerateSpec {
    GenerateSpec {
        caption: "plucked strings".into(),
        duration_seconds: 2.0,
        seed: 4,
        steps: Some(4),
        lm: Some(lm()),
        ..GenerateSpec::default()
    }
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap()
}

#[test]
fn a_plan_fills_what_the_user_left_open_and_its_codes_condition_the_dit() {
    let planner = load_planner(&song()).unwrap().expect("the song asks for a plan");
    let generator = Generator::load(&ModelSource::Folder { path: model() }).unwrap();
    let given = GenerateSpec { bpm: Some(97), keyscale: Some("A minor".into()), ..song() };
    let mut events = Vec::new();
    let planned = plan_song(&given, Some(&planner), &Cancel::never(), &mut |e| events.push(e)).unwrap();
    let Some(GenerateEvent::Planned { codes, bpm, keyscale, timesignature, .. }) = events.last().cloned() else {
        panic!("no plan: {events:?}")
    };
    println!(
        "planned: {codes} codes, bpm {bpm:?}, key {keyscale:?}, meter {timesignature:?}, caption {:?}",
        planned.caption
    );
    assert!(
        codes > 0 && planned.audio_codes.len() == codes,
        "{codes} codes, {} in the spec",
        planned.audio_codes.len()
    );
    assert!(events[..events.len() - 1].iter().all(|e| matches!(e, GenerateEvent::Planning { .. })), "{events:?}");
    // What the user gave stays; what they left open is the LM's; the plan is done.
    assert_eq!((planned.bpm, planned.keyscale.as_deref()), (Some(97), Some("A minor")));
    assert_eq!((bpm, keyscale.as_deref()), (Some(97), Some("A minor")), "the event says what the DiT hears");
    assert_eq!(planned.timesignature, timesignature);
    assert!(planned.lm.is_none(), "a planned spec asks for no second plan");
    assert_eq!((planned.seed, planned.steps, planned.duration_seconds), (4, Some(4), 2.0));

    // The codes reach the DiT: its context is their hints, not silence, and the song differs.
    let unplanned = GenerateSpec { audio_codes: Vec::new(), ..planned.clone() };
    let (hinted, silent) = (generator.condition(&planned).unwrap(), generator.condition(&unplanned).unwrap());
    let context = max_diff(&hinted.context_latents, &silent.context_latents);
    println!("context latents over the plan differ from silence's by up to {context:.3}");
    assert!(context > 1e-3, "the plan's hints are in the context");
    let latents = |spec: &GenerateSpec| generator.latents(spec, &mut |_| {}).unwrap();
    let (with_plan, without) = (latents(&planned), latents(&unplanned));
    assert_eq!(with_plan.dims(), without.dims());
    assert!(max_diff(&with_plan, &without) > 1e-4, "the DiT hears the plan");
    // Planned again: the same codes (greedy), so a song is remade exactly.
    let again = plan_song(&given, Some(&planner), &Cancel::never(), &mut |_| {}).unwrap();
    assert_eq!(again.audio_codes, planned.audio_codes);
    // Asked for a plan, given none: an error, never a silent unplanned song.
    let err = plan_song(&given, None, &Cancel::never(), &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("no LM was loaded"), "{err}");
    assert!(generator.latents(&given, &mut |_| {}).is_err(), "the DiT refuses a song not yet planned");
}

/// A LoRA on the fixture model with non-zero A and B, saved to `dir`.
fn saved_adapter(dir: &Path) -> PathBuf {
    let folder = ModelFolder::open(&model(), None).unwrap();
    let dit = DitModel::new(&folder.dit, &folder.load_decoder(DType::F32, &Device::Cpu).unwrap()).unwrap();
    let config = LoraConfig { r: 4, alpha: 4.0, ..LoraConfig::default() };
    let fresh = LoraAdapter::new(config.clone(), &dit, 3).unwrap();
    let tensors: HashMap<String, Tensor> =
        fresh.named_tensors().into_iter().map(|(k, t)| (k, Tensor::randn_like(&t, 0.0, 0.1).unwrap())).collect();
    LoraAdapter::from_tensors(config, &dit, &tensors, Path::new("test")).unwrap().save(dir).unwrap();
    dir.to_path_buf()
}

#[test]
fn a_pair_asking_for_a_plan_is_planned_once_and_both_sides_hear_it() {
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("run");
    std::fs::create_dir_all(&run_dir).unwrap();
    let config = RunConfig { model: ModelSource::Folder { path: model() }, ..RunConfig::default() };
    std::fs::write(run_dir.join("run.toml"), config.to_toml()).unwrap();
    let adapter = saved_adapter(&tmp.path().join("other/adapter"));
    let request = PairRequest { a: AbVoice::Base, b: AbVoice::Adapter { path: adapter, scale: 1.0 }, song: song() };
    let mut events = Vec::new();
    let out = new_pair_dir(&run_dir, 4);
    let pair = generate_pair_for_run(&run_dir, &request, &out, &mut |side, e| events.push((side, e))).unwrap();
    let plans: Vec<Side> =
        events.iter().filter(|(_, e)| matches!(e, GenerateEvent::Planned { .. })).map(|(s, _)| *s).collect();
    assert_eq!(plans, [Side::A], "one plan, reported on A");
    let kept = |wav: &Option<PathBuf>| -> GenerateSpec {
        serde_json::from_slice(&std::fs::read(wav.as_ref().unwrap().with_extension("json")).unwrap()).unwrap()
    };
    let (a, b) = (kept(&pair.a), kept(&pair.b));
    println!("A {} and B {} audio codes", a.audio_codes.len(), b.audio_codes.len());
    assert!(!a.audio_codes.is_empty() && a.audio_codes == b.audio_codes, "both sides over the same codes");
    assert_eq!((a.adapter_scale, b.adapter_scale), (0.0, 1.0));
    assert_eq!((&a.caption, &a.bpm, &a.keyscale), (&b.caption, &b.bpm, &b.keyscale), "and the same metadata");
    let wav = |p: &Option<PathBuf>| std::fs::read(p.as_ref().unwrap()).unwrap();
    assert!(wav(&pair.a) != wav(&pair.b), "B is the adapter's");
    assert_eq!(pair.request, Ok(request), "the request kept as asked");
}
