//! Where ACE-Step 1.5 lives on the Hugging Face hub: the repositories and the parts of
//! them a training run needs, as data. Read off ACE-Step 1.5's own downloader
//! (`acestep/model_downloader.py`): the main repository holds the turbo DiT, the VAE,
//! the text encoder (and a 5 Hz language model training does not use); base, SFT and
//! the three XL (4B) DiTs are repositories of their own whose root is the DiT folder,
//! and take the VAE and text encoder from the main repository (the downloader fetches
//! the main model before any of them). The 5 Hz LMs that label songs ("understand"
//! mode) are one folder each: the 1.7B in the main repository, the 0.6B and 4B
//! repositories of their own.

use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::kind::{Flavor, ModelKind, ModelSize};
use super::layout::{TEXT_DIR, VAE_DIR};

/// The repository with the turbo DiT, `vae/` and `Qwen3-Embedding-0.6B/`.
pub const MAIN_REPO: &str = "ACE-Step/Ace-Step1.5";
/// The branch every part is downloaded from (resolved to a commit when it starts).
pub const REVISION: &str = "main";

/// A DiT a user can download. Named on the command line and in events by `name()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DitVariant {
    Turbo,
    Base,
    Sft,
    XlTurbo,
    XlBase,
    XlSft,
}

impl DitVariant {
    pub const ALL: [DitVariant; 6] = [
        DitVariant::Turbo,
        DitVariant::Base,
        DitVariant::Sft,
        DitVariant::XlTurbo,
        DitVariant::XlBase,
        DitVariant::XlSft,
    ];
    /// `name()` of each of `ALL`, in order: what a front end offers.
    pub const NAMES: [&'static str; 6] = ["turbo", "base", "sft", "xl-turbo", "xl-base", "xl-sft"];

    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    /// The DiT's folder name in a model folder (ACE-Step's `checkpoints/` layout).
    pub fn dit_folder(self) -> &'static str {
        match self {
            DitVariant::Turbo => "acestep-v15-turbo",
            DitVariant::Base => "acestep-v15-base",
            DitVariant::Sft => "acestep-v15-sft",
            DitVariant::XlTurbo => "acestep-v15-xl-turbo",
            DitVariant::XlBase => "acestep-v15-xl-base",
            DitVariant::XlSft => "acestep-v15-xl-sft",
        }
    }

    pub fn size(self) -> ModelSize {
        match self {
            DitVariant::Turbo | DitVariant::Base | DitVariant::Sft => ModelSize::TwoB,
            DitVariant::XlTurbo | DitVariant::XlBase | DitVariant::XlSft => ModelSize::Xl,
        }
    }

    pub fn flavor(self) -> Flavor {
        match self {
            DitVariant::Turbo | DitVariant::XlTurbo => Flavor::Turbo,
            DitVariant::Base | DitVariant::XlBase => Flavor::Base,
            DitVariant::Sft | DitVariant::XlSft => Flavor::Sft,
        }
    }

    /// Whether a model of `kind` (as its config.json says) is this variant.
    pub fn matches(self, kind: ModelKind) -> bool {
        kind == ModelKind { size: self.size(), flavor: self.flavor() }
    }

    /// Every part a run of this variant reads: the DiT, the VAE and the text encoder.
    pub fn parts(self) -> [Part; 3] {
        let dit = match self {
            DitVariant::Turbo => Part { repo: MAIN_REPO, prefix: "acestep-v15-turbo/", folder: self.dit_folder() },
            // Each its own repository, `ACE-Step/<folder>`, the DiT folder at its root.
            DitVariant::Base => Part { repo: "ACE-Step/acestep-v15-base", prefix: "", folder: self.dit_folder() },
            DitVariant::Sft => Part { repo: "ACE-Step/acestep-v15-sft", prefix: "", folder: self.dit_folder() },
            DitVariant::XlTurbo => {
                Part { repo: "ACE-Step/acestep-v15-xl-turbo", prefix: "", folder: self.dit_folder() }
            }
            DitVariant::XlBase => Part { repo: "ACE-Step/acestep-v15-xl-base", prefix: "", folder: self.dit_folder() },
            DitVariant::XlSft => Part { repo: "ACE-Step/acestep-v15-xl-sft", prefix: "", folder: self.dit_folder() },
        };
        [
            dit,
            Part { repo: MAIN_REPO, prefix: "vae/", folder: VAE_DIR },
            Part { repo: MAIN_REPO, prefix: "Qwen3-Embedding-0.6B/", folder: TEXT_DIR },
        ]
    }
}

impl FromStr for DitVariant {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        DitVariant::ALL
            .into_iter()
            .find(|v| v.name() == s.to_ascii_lowercase())
            .ok_or_else(|| format!("unknown variant `{s}` (expected {})", Self::NAMES.join(", ")))
    }
}

/// A 5 Hz LM a user can download (for labelling songs). Named like `DitVariant`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LmVariant {
    #[serde(rename = "lm-0.6b")]
    Lm0_6B,
    #[serde(rename = "lm-1.7b")]
    Lm1_7B,
    #[serde(rename = "lm-4b")]
    Lm4B,
}

impl LmVariant {
    pub const ALL: [LmVariant; 3] = [LmVariant::Lm0_6B, LmVariant::Lm1_7B, LmVariant::Lm4B];
    /// `name()` of each of `ALL`, in order.
    pub const NAMES: [&'static str; 3] = ["lm-0.6b", "lm-1.7b", "lm-4b"];
    /// ACE-Step's default LM (the one its main repository ships).
    pub const DEFAULT: LmVariant = LmVariant::Lm1_7B;

    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    /// The LM's folder name in ACE-Step's `checkpoints/` layout and on the hub.
    pub fn folder(self) -> &'static str {
        match self {
            LmVariant::Lm0_6B => "acestep-5Hz-lm-0.6B",
            LmVariant::Lm1_7B => "acestep-5Hz-lm-1.7B",
            LmVariant::Lm4B => "acestep-5Hz-lm-4B",
        }
    }

    /// The variant whose folder is named `folder` (the case as on the hub or not).
    pub fn of_folder(folder: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.folder().eq_ignore_ascii_case(folder))
    }

    /// The download's size in words, before the hub is asked: Qwen3's parameter count
    /// (0.6B, 1.7B, 4B, plus the 65535 audio-code embeddings) at bf16's two bytes
    /// each. An estimate: the hub's listing (the `Planned` event) gives the bytes.
    pub fn approx_size(self) -> &'static str {
        match self {
            LmVariant::Lm0_6B => "about 1.3 GB",
            LmVariant::Lm1_7B => "about 3.7 GB",
            LmVariant::Lm4B => "about 8.4 GB",
        }
    }

    /// The one folder a download fetches: every file of it.
    pub fn part(self) -> Part {
        match self {
            LmVariant::Lm1_7B => Part { repo: MAIN_REPO, prefix: "acestep-5Hz-lm-1.7B/", folder: self.folder() },
            // `ACE-Step/<folder>`, the LM folder at the repository's root.
            LmVariant::Lm0_6B => Part { repo: "ACE-Step/acestep-5Hz-lm-0.6B", prefix: "", folder: self.folder() },
            LmVariant::Lm4B => Part { repo: "ACE-Step/acestep-5Hz-lm-4B", prefix: "", folder: self.folder() },
        }
    }
}

impl FromStr for LmVariant {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        LmVariant::ALL
            .into_iter()
            .find(|v| v.name() == s.to_ascii_lowercase())
            .ok_or_else(|| format!("unknown LM `{s}` (expected {})", Self::NAMES.join(", ")))
    }
}

/// What can be downloaded: a DiT (with its VAE and text encoder) or a 5 Hz LM. Named
/// (on the command line, in events) by the variant's own name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Downloadable {
    Dit(DitVariant),
    Lm(LmVariant),
}

impl Downloadable {
    /// Every name, DiTs first: what `FromStr` takes.
    pub fn names() -> impl Iterator<Item = &'static str> {
        DitVariant::NAMES.into_iter().chain(LmVariant::NAMES)
    }

    pub fn name(self) -> &'static str {
        match self {
            Downloadable::Dit(v) => v.name(),
            Downloadable::Lm(v) => v.name(),
        }
    }

    /// The folders a download fetches; the first is the one it returns.
    pub fn parts(self) -> Vec<Part> {
        match self {
            Downloadable::Dit(v) => v.parts().to_vec(),
            Downloadable::Lm(v) => vec![v.part()],
        }
    }
}

impl From<DitVariant> for Downloadable {
    fn from(v: DitVariant) -> Self {
        Downloadable::Dit(v)
    }
}

impl From<LmVariant> for Downloadable {
    fn from(v: LmVariant) -> Self {
        Downloadable::Lm(v)
    }
}

impl FromStr for Downloadable {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        s.parse::<DitVariant>()
            .map(Downloadable::Dit)
            .or_else(|_| s.parse::<LmVariant>().map(Downloadable::Lm))
            .map_err(|_| format!("unknown model `{s}` (expected {})", Self::names().collect::<Vec<_>>().join(", ")))
    }
}

/// One folder of a model folder: every file of `repo` under `prefix` (all of it when
/// empty), which becomes `<model>/<folder>/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    pub repo: &'static str,
    pub prefix: &'static str,
    pub folder: &'static str,
}

impl Part {
    /// Whether the repository file `path` belongs to this part.
    pub fn holds(&self, path: &str) -> bool {
        path.starts_with(self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_parse_and_name_their_folders() {
        assert_eq!("SFT".parse::<DitVariant>(), Ok(DitVariant::Sft));
        assert_eq!("XL-Turbo".parse::<DitVariant>(), Ok(DitVariant::XlTurbo));
        let err = "xl".parse::<DitVariant>().unwrap_err();
        assert!(err.contains("turbo, base, sft, xl-turbo, xl-base, xl-sft"), "{err}");
        for v in DitVariant::ALL {
            assert_eq!(v.name().parse::<DitVariant>(), Ok(v));
            assert_eq!(serde_json::to_value(v).unwrap(), v.name(), "events name it as the command line does");
            let [dit, vae, text] = v.parts();
            assert_eq!(dit.folder, v.dit_folder());
            assert_eq!((vae.folder, text.folder), ("vae", "Qwen3-Embedding-0.6B"));
            assert_eq!((vae.repo, text.repo), (MAIN_REPO, MAIN_REPO));
            assert!(vae.holds("vae/config.json") && !vae.holds("vae2/x"));
            // Every DiT but the main repository's turbo is `ACE-Step/<its folder>`.
            if v != DitVariant::Turbo {
                assert_eq!((dit.repo, dit.prefix), (format!("ACE-Step/{}", v.dit_folder()).as_str(), ""));
            }
        }
    }

    #[test]
    fn xl_variants_are_the_xl_size_of_each_flavor() {
        let xl: Vec<_> = DitVariant::ALL.into_iter().filter(|v| v.size() == ModelSize::Xl).collect();
        assert_eq!(xl, [DitVariant::XlTurbo, DitVariant::XlBase, DitVariant::XlSft]);
        for (two_b, xl) in DitVariant::ALL[..3].iter().zip(&xl) {
            assert_eq!((two_b.size(), two_b.flavor()), (ModelSize::TwoB, xl.flavor()));
            assert_eq!(xl.name(), format!("xl-{}", two_b.name()));
        }
        let xl_sft = ModelKind { size: ModelSize::Xl, flavor: Flavor::Sft };
        assert!(DitVariant::XlSft.matches(xl_sft) && !DitVariant::Sft.matches(xl_sft));
    }

    #[test]
    fn lms_parse_and_name_their_repositories() {
        assert_eq!("LM-1.7B".parse::<LmVariant>(), Ok(LmVariant::Lm1_7B));
        let err = "lm-2b".parse::<LmVariant>().unwrap_err();
        assert!(err.contains("lm-0.6b, lm-1.7b, lm-4b"), "{err}");
        for v in LmVariant::ALL {
            assert_eq!(v.name().parse::<LmVariant>(), Ok(v));
            assert_eq!(serde_json::to_value(v).unwrap(), v.name());
            assert_eq!(LmVariant::of_folder(&v.folder().to_ascii_lowercase()), Some(v));
            let part = v.part();
            assert_eq!(part.folder, v.folder());
            if v == LmVariant::DEFAULT {
                assert_eq!((part.repo, part.prefix), (MAIN_REPO, "acestep-5Hz-lm-1.7B/"));
            } else {
                assert_eq!((part.repo, part.prefix), (format!("ACE-Step/{}", v.folder()).as_str(), ""));
            }
        }
        assert_eq!(LmVariant::of_folder("acestep-v15-turbo"), None);
    }

    #[test]
    fn a_downloadable_is_named_by_its_variant() {
        for name in Downloadable::names() {
            let d: Downloadable = name.parse().unwrap();
            assert_eq!(d.name(), name);
            assert_eq!(serde_json::to_value(d).unwrap(), name, "events name it as the command line does");
            assert_eq!(serde_json::from_value::<Downloadable>(name.into()).unwrap(), d);
        }
        assert_eq!("turbo".parse(), Ok(Downloadable::Dit(DitVariant::Turbo)));
        assert_eq!(Downloadable::from(LmVariant::Lm4B).parts(), [LmVariant::Lm4B.part()]);
        assert_eq!(Downloadable::from(DitVariant::Sft).parts(), DitVariant::Sft.parts());
        let err = "xl".parse::<Downloadable>().unwrap_err();
        assert!(err.contains("turbo, base, sft, xl-turbo, xl-base, xl-sft, lm-0.6b, lm-1.7b, lm-4b"), "{err}");
    }
}
