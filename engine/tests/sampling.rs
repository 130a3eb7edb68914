//! The sampler against every `sample_*` fixture: ACE-Step 1.5's own turbo loop
//! (`generate_audio`, shared fixtures) and diffusers' `AceStepPipeline` loop with APG
//! guidance (this crate's `tests/fixtures/sample_guided_*`): each step's x_t and the
//! clean latents, without and with the fixture's LoRA.

mod common;

use candle_core::{DType, Device, Tensor};
use common::{max_abs_diff, sample_fixtures, Fixture};
use ostinato_engine::generate::sampler::{sample, timesteps, Conditions, Guidance};
use ostinato_engine::lora::{LoraAdapter, LoraMode};
use ostinato_engine::model::{DecoderWeights, DitModel, LinearAdapter};

const TOL: f32 = 1e-4;

fn load_model(f: &Fixture) -> DitModel {
    let cfg = f.config();
    let w = DecoderWeights::load(&[f.weights.as_path()], &cfg, DType::F32, &Device::Cpu)
        .unwrap_or_else(|e| panic!("{}: {e}", f.name));
    DitModel::new(&cfg, &w).unwrap()
}

fn guidance(f: &Fixture) -> Option<Guidance> {
    let g = f.json["sampler"].get("guidance_scale")?.as_f64()?;
    let interval = &f.json["sampler"]["cfg_interval"];
    Some(Guidance {
        scale: g,
        null_condition: f.t("in.null_condition_emb").clone(),
        interval: (interval[0].as_f64().unwrap(), interval[1].as_f64().unwrap()),
    })
}

/// The sampler on the fixture's inputs; x_t entering every step, and the result.
fn run(f: &Fixture, model: &DitModel, lora: Option<&dyn LinearAdapter>) -> (Vec<Tensor>, Tensor) {
    let s = &f.json["sampler"];
    let schedule = timesteps(s["steps"].as_u64().unwrap() as usize, s["shift"].as_f64().unwrap()).unwrap();
    let fixture_t: Vec<f32> = f.t("in.timesteps").to_vec1().unwrap();
    assert_eq!(schedule, fixture_t, "{}: the schedule must match the reference's bit for bit", f.name);
    let cond = Conditions {
        context_latents: f.t("in.context_latents").clone(),
        encoder_hidden_states: f.t("in.encoder_hidden_states").clone(),
    };
    let mut xs = Vec::new();
    let g = guidance(f);
    let out = sample(model, lora, f.t("in.noise"), &cond, &schedule, g.as_ref(), |_, x| {
        xs.push(x.clone());
        Ok(())
    })
    .unwrap();
    (xs, out)
}

#[test]
fn sampler_matches_every_reference_loop() {
    for f in sample_fixtures() {
        let model = load_model(&f);
        let (xs, out) = run(&f, &model, None);
        for (k, x) in xs.iter().enumerate() {
            let err = max_abs_diff(x, f.t(&format!("dbg.xt.{k}")));
            println!("{}: dbg.xt.{k} max abs error {err:.3e}", f.name);
            assert!(err <= TOL, "{}: step {k} x_t error {err:e}", f.name);
        }
        let err = max_abs_diff(&out, f.t("out.latents"));
        println!(
            "{}: out.latents max abs error {err:.3e} ({} steps, guidance {:?})",
            f.name,
            xs.len(),
            guidance(&f).map(|g| g.scale)
        );
        assert!(err <= TOL, "{}: out.latents error {err:e}", f.name);

        let adapter = LoraAdapter::from_tensors(f.lora_config(), &model, &f.group("lora."), &f.weights).unwrap();
        let ctx = adapter.ctx(LoraMode::Eval, false);
        let (_, lora_out) = run(&f, &model, Some(&ctx));
        let err = max_abs_diff(&lora_out, f.t("out.latents_lora"));
        let effect = max_abs_diff(f.t("out.latents_lora"), f.t("out.latents"));
        println!("{}: out.latents_lora max abs error {err:.3e} (the LoRA moves the latents by {effect:.3e})", f.name);
        assert!(err <= TOL, "{}: out.latents_lora error {err:e}", f.name);
        assert!(effect > 10.0 * TOL, "{}: the LoRA must make a measurable difference", f.name);

        // Strength 0 adds nothing: the base model's latents, bit for bit.
        let (_, zero) = run(&f, &model, Some(&adapter.ctx(LoraMode::Eval, false).with_strength(0.0)));
        assert_eq!(max_abs_diff(&zero, &out), 0.0, "{}: adapter strength 0 must be the base model", f.name);
        // Strength 0.5 lands between the two.
        let (_, half) = run(&f, &model, Some(&adapter.ctx(LoraMode::Eval, false).with_strength(0.5)));
        let (to_base, to_lora) = (max_abs_diff(&half, &out), max_abs_diff(&half, f.t("out.latents_lora")));
        println!("{}: strength 0.5 is {to_base:.3e} from the base, {to_lora:.3e} from the full adapter", f.name);
        assert!(to_base > 0.0 && to_lora > 0.0 && to_base < effect && to_lora < effect);
    }
}
