//! Audio as the codecs take and give it.

/// Audio as the encoders take it: two equally long channels at `sample_rate`.
#[derive(Debug, Clone, PartialEq)]
pub struct StereoAudio {
    pub sample_rate: u32,
    pub left: Vec<f32>,
    pub right: Vec<f32>,
}

impl StereoAudio {
    pub fn silence(sample_rate: u32, frames: usize) -> Self {
        Self { sample_rate, left: vec![0.0; frames], right: vec![0.0; frames] }
    }

    pub fn frames(&self) -> usize {
        self.left.len()
    }

    pub fn duration_seconds(&self) -> f64 {
        self.frames() as f64 / self.sample_rate as f64
    }

    /// Largest absolute sample value.
    pub fn peak(&self) -> f32 {
        self.left.iter().chain(&self.right).fold(0.0f32, |m, x| m.max(x.abs()))
    }

    /// The frames `[start, start + len)`, clamped to the audio.
    pub fn slice(&self, start: usize, len: usize) -> Self {
        let start = start.min(self.frames());
        let end = start.saturating_add(len).min(self.frames());
        Self {
            sample_rate: self.sample_rate,
            left: self.left[start..end].to_vec(),
            right: self.right[start..end].to_vec(),
        }
    }
}
