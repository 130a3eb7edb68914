use super::*;

/// `config`'s adapter on `model` with every tensor moved off its start (so that each
/// changes the model), and those tensors.
pub(super) fn moved(
    config: &LoraConfig,
    model: &DitModel,
    seed: u64,
) -> Result<(LoraAdapter, HashMap<String, Tensor>)> {
    let fresh = LoraAdapter::new(config.clone(), model, seed)?;
    let moved: HashMap<String, Tensor> = fresh
        .named_tensors()
        .into_iter()
        .map(|(k, t)| Ok((k, (&t + t.randn_like(0.0, 0.2)?)?)))
        .collect::<Result<_>>()?;
    let adapter = LoraAdapter::from_tensors(config.clone(), model, &moved, Path::new("test"))?;
    Ok((adapter, moved))
}

#[test]
fn targets_by_group_or_module_name() {
    let parsed = parse_targets("self, mlp,q_proj,self").unwrap();
    assert_eq!(parsed.len(), 8, "{parsed:?}");
    let c = LoraConfig { target_modules: parsed, ..Default::default() };
    assert!(c.targets("layers.2.self_attn.k_proj") && c.targets("layers.2.mlp.down_proj"));
    assert!(c.targets("layers.2.cross_attn.q_proj"), "q_proj names both attentions' q");
    assert!(!c.targets("layers.2.cross_attn.k_proj"));
    let cross = LoraConfig { target_modules: parse_targets("cross").unwrap(), ..Default::default() };
    assert!(cross.targets("layers.0.cross_attn.o_proj") && !cross.targets("layers.0.self_attn.o_proj"));
    assert!(parse_targets("attn").is_ok(), "a suffix as PEFT takes it (the model then says if it matches)");
    assert!(parse_targets("self attn").unwrap_err().contains("`self attn`"));
    assert!(parse_targets(" , ").unwrap_err().starts_with("no targets"));
    let none = validate_config(&LoraConfig { target_modules: Vec::new(), ..Default::default() });
    assert!(none.unwrap_err().to_string().contains("lora.target_modules"), "an adapter that trains nothing");
}

#[test]
fn suffix_matching_follows_peft() {
    let c = LoraConfig::default();
    assert!(c.targets("layers.0.self_attn.q_proj"));
    assert!(c.targets("layers.3.cross_attn.o_proj"));
    assert!(!c.targets("layers.0.mlp.up_proj"));
    assert!(!c.targets("layers.0.self_attn.xq_proj"));
}

#[test]
fn a_rank_above_the_narrowest_adapted_layer_is_refused_naming_it() {
    // The demo DiT: 256 wide, its k/v projections 256 -> 128 (two KV heads of 64).
    let dit = crate::load::demo::demo_config();
    let with = |r: usize, targets: &[&str]| {
        let target_modules = targets.iter().map(|t| t.to_string()).collect();
        check_rank(&LoraConfig { r, target_modules, ..Default::default() }, &dit)
    };
    with(128, &["q_proj", "k_proj"]).unwrap();
    let err = with(129, &["q_proj", "k_proj"]).unwrap_err().to_string();
    assert_eq!(
        err,
        "setting `lora.r`: rank 129 is more than 128, the smaller dimension of \
         `layers.0.cross_attn.k_proj` (256 -> 128): choose at most 128"
    );
    // Without the narrow layers the bound is the hidden size.
    with(256, &["q_proj", "o_proj"]).unwrap();
    assert!(with(5000, &["q_proj"]).unwrap_err().to_string().contains("choose at most 256"));
}

#[test]
fn rslora_scaling() {
    let mut c = LoraConfig { r: 16, alpha: 32.0, ..Default::default() };
    assert_eq!(c.scaling(), 2.0);
    c.use_rslora = true;
    assert_eq!(c.scaling(), 8.0);
}
