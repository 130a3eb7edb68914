//! The 5 Hz LM's plan of a song (text2music "thinking") against upstream's own
//! LLMHandler on the committed tiny LM (scripts/make_lm_plan_fixtures.py).

use candle_core::Device;
use ostinato_engine::cancel::Cancel;
use ostinato_engine::device::Precision;
use ostinato_engine::generate::plan::{PlanRequest, PlanSettings, Planner};
use serde_json::Value;

fn fixture() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lm_tiny")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|i| i.as_u64().unwrap() as u32).collect()
}

fn first_difference(a: &[u32], b: &[u32]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y).or((a.len() != b.len()).then_some(a.len().min(b.len())))
}

/// Greedy plans write upstream's ids exactly in both phases (guided and not, with
/// values given and all given), and read the same metadata.
#[test]
fn greedy_plans_write_upstream_s_ids_and_metadata_exactly() {
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture().join("plans.json")).unwrap()).unwrap();
    let plans = expected["plans"].as_array().unwrap();
    assert!(!plans.is_empty());
    for case in plans {
        let name = case["name"].as_str().unwrap();
        let settings = PlanSettings {
            temperature: 0.0,
            top_k: None,
            top_p: None,
            cfg_scale: case["cfg_scale"].as_f64().unwrap() as f32,
            ..PlanSettings::default()
        };
        let planner =
            Planner::load(&fixture().join("acestep-5Hz-lm-tiny"), settings, &Device::Cpu, Precision::F32).unwrap();
        let text = |key: &str| case[key].as_str().map(str::to_string);
        let request = PlanRequest {
            caption: text("caption").unwrap(),
            lyrics: text("lyrics").unwrap(),
            duration_seconds: case["duration"].as_f64().unwrap(),
            bpm: case["bpm"].as_u64().map(|b| b as u32),
            keyscale: text("keyscale"),
            timesignature: text("timesignature"),
            seed: 0,
        };
        let plan = planner.plan(&request, &Cancel::never(), &mut |_| {}).unwrap();
        let (want_meta, want_codes) = (ids(&case["metadata_ids"]), ids(&case["codes_ids"]));
        println!(
            "{name}: metadata {} ids (upstream {}, first difference {:?}), codes {} ids (upstream {}, first difference {:?}), {} codes",
            plan.metadata_ids.len(),
            want_meta.len(),
            first_difference(&plan.metadata_ids, &want_meta),
            plan.codes_ids.len(),
            want_codes.len(),
            first_difference(&plan.codes_ids, &want_codes),
            plan.codes.len(),
        );
        assert_eq!(plan.metadata_ids, want_meta, "{name}: metadata ids");
        assert_eq!(plan.codes_ids, want_codes, "{name}: codes ids");
        assert_eq!(plan.codes, ids(&case["codes"]), "{name}: codes");
        assert_eq!(plan.metadata_text.as_deref(), case["metadata_text"].as_str(), "{name}: metadata text");
        let meta = &case["metadata"];
        let field = |key: &str| meta[key].as_str().map(str::to_string);
        let ours = [&plan.bpm, &plan.caption, &plan.duration, &plan.keyscale, &plan.language, &plan.timesignature];
        for (key, value) in ["bpm", "caption", "duration", "keyscale", "language", "timesignature"].iter().zip(ours) {
            assert_eq!(value, &field(key), "{name}: {key}");
        }
    }
}
