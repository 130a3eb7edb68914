//! Where ACE-Step 1.5 lives on the Hugging Face hub: the repositories and the parts of
//! them a training run needs, as data. Read off ACE-Step 1.5's own downloader
//! (`acestep/model_downloader.py`): the main repository holds the turbo DiT, the VAE,
//! the text encoder (and a 5 Hz language model training does not use); base, SFT and
//! the three XL (4B) DiTs are repositories of their own whose root is the DiT folder,
//! and take the VAE and text encoder from the main repository (the downloader fetches
//! the main model before any of them).

use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::folder::{TEXT_DIR, VAE_DIR};
use super::kind::{Flavor, ModelKind, ModelSize};

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
}
