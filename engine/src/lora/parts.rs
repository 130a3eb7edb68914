//! A strength per part of a DiT layer (self-attention, cross-attention, MLP), as
//! HOT-Step offers it: the part's change scaled on top of the adapter's own strength.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::config::TARGET_GROUPS;

/// The strongest per-part strength (as the adapter's own, see generation's
/// `MAX_ADAPTER_SCALE`).
pub const MAX_PART_STRENGTH: f64 = 4.0;

/// How much of an adapter's change each part of a layer keeps: 1 as the adapter has
/// it, 0 none of it (the base model's weights there, exactly).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PartStrengths {
    #[serde(rename = "self")]
    pub self_attn: f64,
    #[serde(rename = "cross")]
    pub cross_attn: f64,
    pub mlp: f64,
}

impl Default for PartStrengths {
    fn default() -> Self {
        Self { self_attn: 1.0, cross_attn: 1.0, mlp: 1.0 }
    }
}

impl PartStrengths {
    /// Every part at 1: the adapter as it is.
    pub fn is_whole(&self) -> bool {
        *self == Self::default()
    }

    /// The parts by their target group's name (`self`, `cross`, `mlp`), in
    /// `TARGET_GROUPS`' order.
    fn named(&self) -> [(&'static str, f64); 3] {
        [(TARGET_GROUPS[0].0, self.self_attn), (TARGET_GROUPS[1].0, self.cross_attn), (TARGET_GROUPS[2].0, self.mlp)]
    }

    fn part_mut(&mut self, group: &str) -> Option<&mut f64> {
        match group {
            "self" => Some(&mut self.self_attn),
            "cross" => Some(&mut self.cross_attn),
            "mlp" => Some(&mut self.mlp),
            _ => None,
        }
    }

    /// The strength for DiT module `name` (`layers.3.cross_attn.k_proj`): its part's,
    /// by the target group whose suffix it ends with; 1 for a module in none.
    pub fn of(&self, name: &str) -> f64 {
        match TARGET_GROUPS.iter().position(|(_, suffixes)| suffixes.iter().any(|s| name.ends_with(s))) {
            Some(group) => self.named()[group].1,
            None => 1.0,
        }
    }

    /// Each strength in range, or a message naming the part.
    pub fn check(&self) -> std::result::Result<(), String> {
        for (part, strength) in self.named() {
            if !(0.0..=MAX_PART_STRENGTH).contains(&strength) {
                return Err(format!("{part}={strength} is out of range: it must be 0 to {MAX_PART_STRENGTH}"));
            }
        }
        Ok(())
    }
}

/// `self=0.5,mlp=0`: the parts named, the others at 1.
impl FromStr for PartStrengths {
    type Err = String;

    fn from_str(text: &str) -> std::result::Result<Self, String> {
        let mut parts = Self::default();
        for item in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (part, value) =
                item.split_once('=').ok_or_else(|| format!("`{item}` is not PART=STRENGTH (e.g. cross=0.5)"))?;
            let slot = parts
                .part_mut(part.trim())
                .ok_or_else(|| format!("`{}` is not a part: they are self, cross and mlp", part.trim()))?;
            *slot = value.trim().parse().map_err(|_| format!("`{}` in `{item}` is not a number", value.trim()))?;
        }
        parts.check()?;
        Ok(parts)
    }
}

impl fmt::Display for PartStrengths {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text: Vec<String> = self.named().iter().map(|(part, s)| format!("{part}={s}")).collect();
        f.write_str(&text.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_parse_by_name_and_find_each_module() {
        let parts: PartStrengths = "cross=0.5, mlp=0".parse().unwrap();
        assert_eq!(parts, PartStrengths { self_attn: 1.0, cross_attn: 0.5, mlp: 0.0 });
        assert_eq!(parts.to_string().parse::<PartStrengths>().unwrap(), parts);
        assert_eq!(parts.of("layers.0.self_attn.q_proj"), 1.0);
        assert_eq!(parts.of("layers.7.cross_attn.o_proj"), 0.5);
        assert_eq!(parts.of("layers.2.mlp.down_proj"), 0.0);
        for bad in ["attn=1", "self", "mlp=x", "self=5", "cross=-1"] {
            let err = bad.parse::<PartStrengths>().unwrap_err();
            println!("{bad}: {err}");
            assert!(err.contains(bad.split('=').next().unwrap()) || err.contains("range"), "{err}");
        }
    }
}
