//! Where ACE-Step 1.5 lives on the Hugging Face hub: the repositories and the parts of
//! them a training run needs, as data. Read off ACE-Step 1.5's own downloader
//! (`acestep/model_downloader.py`): the main repository holds the turbo DiT, the VAE,
//! the text encoder (and a 5 Hz language model training does not use); base and SFT
//! are repositories of their own whose root is the DiT folder.

use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::folder::{TEXT_DIR, VAE_DIR};

/// The repository with the turbo DiT, `vae/` and `Qwen3-Embedding-0.6B/`.
pub const MAIN_REPO: &str = "ACE-Step/Ace-Step1.5";
/// The branch every part is downloaded from (resolved to a commit when it starts).
pub const REVISION: &str = "main";

/// A DiT a user can download.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DitVariant {
    Turbo,
    Base,
    Sft,
}

impl DitVariant {
    pub const ALL: [DitVariant; 3] = [DitVariant::Turbo, DitVariant::Base, DitVariant::Sft];

    pub fn name(self) -> &'static str {
        match self {
            DitVariant::Turbo => "turbo",
            DitVariant::Base => "base",
            DitVariant::Sft => "sft",
        }
    }

    /// The DiT's folder name in a model folder (ACE-Step's `checkpoints/` layout).
    pub fn dit_folder(self) -> &'static str {
        match self {
            DitVariant::Turbo => "acestep-v15-turbo",
            DitVariant::Base => "acestep-v15-base",
            DitVariant::Sft => "acestep-v15-sft",
        }
    }

    /// Every part a run of this variant reads: the DiT, the VAE and the text encoder.
    pub fn parts(self) -> [Part; 3] {
        let dit = match self {
            DitVariant::Turbo => Part { repo: MAIN_REPO, prefix: "acestep-v15-turbo/", folder: "acestep-v15-turbo" },
            DitVariant::Base => Part { repo: "ACE-Step/acestep-v15-base", prefix: "", folder: "acestep-v15-base" },
            DitVariant::Sft => Part { repo: "ACE-Step/acestep-v15-sft", prefix: "", folder: "acestep-v15-sft" },
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
            .ok_or_else(|| format!("unknown variant `{s}` (expected turbo, base or sft)"))
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
        assert!("xl".parse::<DitVariant>().unwrap_err().contains("turbo, base or sft"));
        for v in DitVariant::ALL {
            let [dit, vae, text] = v.parts();
            assert_eq!(dit.folder, v.dit_folder());
            assert_eq!((vae.folder, text.folder), ("vae", "Qwen3-Embedding-0.6B"));
            assert!(vae.holds("vae/config.json") && !vae.holds("vae2/x"));
        }
    }
}
