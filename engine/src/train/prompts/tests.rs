use super::*;
use crate::data::TagMode;

fn run(trigger: Option<&TriggerTag>) -> PromptDefaults<'_> {
    PromptDefaults { caption: "first song", seconds: 10.0, seed: 7, trigger }
}

#[test]
fn a_prompt_fills_in_the_run_and_its_trigger_word() {
    let tag = TriggerTag { tag: "ostn style".into(), mode: TagMode::Prepend };
    let prompt: PreviewPrompt =
        "caption=[trigger], lofi piano; lyrics=la\\nla; bpm=90; key=A minor; time_signature=3/4; seconds=4; seed=3; steps=2; guidance=5"
            .parse()
            .unwrap();
    let spec = prompt.spec(&run(Some(&tag))).unwrap();
    assert_eq!(spec.caption, "ostn style, lofi piano");
    assert_eq!(spec.lyrics, "la\nla");
    assert_eq!(
        (spec.bpm, spec.keyscale.as_deref(), spec.timesignature.as_deref()),
        (Some(90), Some("A minor"), Some("3/4"))
    );
    assert_eq!((spec.duration_seconds, spec.seed, spec.steps, spec.guidance), (4.0, 3, Some(2), Some(5.0)));
    // Left out: the run's caption, length and seed.
    let plain = PreviewPrompt::default().spec(&run(None)).unwrap();
    assert_eq!((plain.caption.as_str(), plain.duration_seconds, plain.seed), ("first song", 10.0, 7));
}

#[test]
fn a_prompt_mixes_in_other_adapters_each_at_its_strength() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let text = format!("caption=x; adapter={}@0.5; adapter={}", a.path().display(), b.path().display());
    let prompt: PreviewPrompt = text.parse().unwrap();
    let want = vec![
        MixedAdapter { path: a.path().to_path_buf(), scale: 0.5 },
        MixedAdapter { path: b.path().to_path_buf(), scale: 1.0 },
    ];
    assert_eq!(prompt.more_adapters, want);
    assert_eq!(prompt.spec(&run(None)).unwrap().more_adapters, want, "the preview's song mixes them in");
    // Checked with the run: a strength out of range, a folder that is not there.
    for (text, field) in [
        (format!("adapter={}@9", a.path().display()), "preview_prompts[0].more_adapters[0].scale"),
        ("adapter=/no/such/adapter".to_string(), "preview_prompts[0].more_adapters[0].path"),
    ] {
        let mut e = SettingErrors::default();
        check_prompts(&[text.parse().unwrap()], &run(None), &mut e);
        let named: Vec<&str> = e.iter().map(|(f, _)| f).collect();
        assert_eq!(named, [field], "{text}");
    }
    assert!("adapter=/x@loud".parse::<PreviewPrompt>().unwrap_err().contains("folder@strength"));
}

#[test]
fn each_wrong_field_is_named() {
    let cases = [
        ("caption=[trigger] beat", "caption"),
        ("lyrics=[trigger]", "lyrics"),
        ("bpm=500", "bpm"),
        ("key=H major", "keyscale"),
        ("timesignature=5/4", "timesignature"),
        ("seconds=0", "seconds"),
        ("seconds=601", "seconds"),
        ("steps=0", "steps"),
        ("guidance=0.5", "guidance"),
    ];
    for (text, field) in cases {
        let prompt: PreviewPrompt = text.parse().unwrap();
        let mut e = SettingErrors::default();
        check_prompts(&[PreviewPrompt::default(), prompt], &run(None), &mut e);
        let named: Vec<&str> = e.iter().map(|(f, _)| f).collect();
        assert_eq!(named, [format!("preview_prompts[1].{field}")], "{text}");
    }
    for (text, says) in
        [("tempo=90", "`tempo` is not a prompt field"), ("bpm=fast", "bpm: `fast`"), ("lofi", "field=value")]
    {
        let err = text.parse::<PreviewPrompt>().unwrap_err();
        assert!(err.contains(says), "{text}: {err}");
    }
}

#[test]
fn prompts_read_back_from_toml() {
    let prompt = PreviewPrompt { caption: "x".into(), bpm: Some(100), seconds: Some(3.5), ..Default::default() };
    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct Holder {
        preview_prompts: Vec<PreviewPrompt>,
    }
    let holder = Holder { preview_prompts: vec![prompt.clone(), PreviewPrompt::default()] };
    let text = toml::to_string(&holder).unwrap();
    assert_eq!(toml::from_str::<Holder>(&text).unwrap(), holder, "{text}");
    let err = toml::from_str::<Holder>("[[preview_prompts]]\ntempo = 3\n").unwrap_err().to_string();
    assert!(err.contains("tempo"), "{err}");
}
