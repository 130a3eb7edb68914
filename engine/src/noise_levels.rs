//! Loss by noise level, replayed from a run's events: the mean loss of the samples
//! trained at each timestep bucket, in the first epoch and in the latest, so a user
//! sees which noise levels the adapter is learning. A run that draws t from a fixed
//! set (turbo: its 8 timesteps) is bucketed by those; any other by 8 equal spans of
//! [0, 1].

use crate::events::{Event, SampleLoss};
use crate::run_state::RunState;

/// Buckets when t is drawn from a continuous distribution.
pub const SPANS: usize = 8;

/// The mean loss per bucket of one epoch.
#[derive(Debug, Clone, PartialEq)]
pub struct EpochLosses {
    /// 0-based, as in the events.
    pub epoch: u64,
    /// Per bucket (in `LossByNoiseLevel::levels` order): the mean loss of its samples,
    /// `None` when the epoch trained none there.
    pub means: Vec<Option<f64>>,
    /// Per bucket: how many samples the mean is over.
    pub counts: Vec<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LossByNoiseLevel {
    /// Each bucket's t, ascending: the run's fixed timestep, or the middle of its span.
    pub levels: Vec<f64>,
    /// True when `levels` are the run's fixed timesteps.
    pub fixed: bool,
    /// The first epoch with samples, then the latest when it is another; empty when
    /// the log holds no per-sample losses (nothing trained yet, or an older log).
    pub epochs: Vec<EpochLosses>,
}

/// Buckets the per-sample losses of a replay. Steps a resumed run logged again
/// replace the earlier ones, as in the other charts.
pub fn loss_by_noise_level(events: &[Event]) -> LossByNoiseLevel {
    loss_by_noise_level_of(&RunState::replay(events))
}

/// Buckets the per-sample losses of the steps a run's state holds.
pub fn loss_by_noise_level_of(state: &RunState) -> LossByNoiseLevel {
    let fixed: Option<Vec<f64>> = state.timestep_levels().map(|l| l.iter().map(|&t| t as f64).collect());
    let steps: Vec<(u64, u64, &[SampleLoss])> =
        state.series().iter().map(|s| (s.step, s.epoch, s.samples.as_slice())).collect();
    let levels = match &fixed {
        Some(l) => {
            let mut l = l.clone();
            l.sort_by(f64::total_cmp);
            l.dedup();
            l
        }
        None => (0..SPANS).map(|i| (i as f64 + 0.5) / SPANS as f64).collect(),
    };
    let bucket = |t: f64| match fixed {
        // The nearest fixed timestep (the logged t is the trainer's f32 of it).
        Some(_) => {
            (0..levels.len()).min_by(|&a, &b| (levels[a] - t).abs().total_cmp(&(levels[b] - t).abs())).unwrap_or(0)
        }
        None => ((t * SPANS as f64) as usize).min(SPANS - 1),
    };
    let with_samples = || steps.iter().filter(|s| !s.2.is_empty()).map(|s| s.1);
    let chosen = match (with_samples().min(), with_samples().max()) {
        (Some(first), Some(latest)) if first != latest => vec![first, latest],
        (Some(first), _) => vec![first],
        _ => vec![],
    };
    let epochs = chosen
        .into_iter()
        .map(|epoch| {
            let mut sums = vec![0.0; levels.len()];
            let mut counts = vec![0u64; levels.len()];
            for sample in steps.iter().filter(|s| s.1 == epoch).flat_map(|s| s.2) {
                let i = bucket(sample.t as f64);
                sums[i] += sample.loss as f64;
                counts[i] += 1;
            }
            let means = sums.iter().zip(&counts).map(|(&s, &n)| (n > 0).then(|| s / n as f64)).collect();
            EpochLosses { epoch, means, counts }
        })
        .collect();
    LossByNoiseLevel { fixed: fixed.is_some(), levels, epochs }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(step: u64, epoch: u64, samples: &[(f32, f32)]) -> Event {
        Event::Step {
            step,
            epoch,
            loss: 1.0,
            lr: 1e-4,
            grad_norm: 1.0,
            samples_per_sec: 1.0,
            memory_now_bytes: 0,
            memory_peak_bytes: 0,
            elapsed_s: 0.0,
            eta_s: None,
            samples: samples.iter().map(|&(t, loss)| SampleLoss { t, loss }).collect(),
        }
    }

    fn started(levels: Option<Vec<f32>>) -> Event {
        Event::RunStarted {
            config: serde_json::json!({}),
            device: "cpu".into(),
            precision: "f32".into(),
            memory: crate::events::MemoryFeatures {
                gradient_checkpointing: true,
                block_input_grad_path: true,
                latent_cache: true,
                predicted_peak_bytes: None,
                machine: None,
            },
            adapter: "LoRA r 64 alpha 128".into(),
            trainable_params: 1,
            total_params: 2,
            cfg_dropout: 0.0,
            timestep_levels: levels,
            dataset: crate::events::DatasetSummary {
                files: 1,
                usable: 1,
                skipped: 0,
                cache_hits: 0,
                cache_misses: 1,
                total_seconds: 1.0,
                seconds_in_files: None,
            },
            total_steps: 10,
        }
    }

    #[test]
    fn continuous_timesteps_fall_into_eight_spans_and_each_epoch_is_averaged_apart() {
        let events = [
            started(None),
            step(1, 0, &[(0.05, 2.0), (0.10, 4.0)]),
            step(2, 0, &[(0.99, 1.0), (1.0, 3.0)]),
            step(3, 1, &[(0.5, 9.0)]),
            step(4, 2, &[(0.06, 1.0), (0.55, 0.5)]),
        ];
        let r = loss_by_noise_level(&events);
        assert!(!r.fixed);
        assert_eq!(r.levels, [0.0625, 0.1875, 0.3125, 0.4375, 0.5625, 0.6875, 0.8125, 0.9375]);
        let [first, latest] = &r.epochs[..] else { panic!("{:?}", r.epochs) };
        assert_eq!(first.epoch, 0);
        assert_eq!(
            first.means,
            [Some(3.0), None, None, None, None, None, None, Some(2.0)],
            "t = 1 is in the last span"
        );
        assert_eq!(first.counts, [2, 0, 0, 0, 0, 0, 0, 2]);
        assert_eq!(latest.epoch, 2, "the latest epoch, not the one between");
        assert_eq!(latest.means, [Some(1.0), None, None, None, Some(0.5), None, None, None]);
    }

    #[test]
    fn fixed_timesteps_are_the_buckets_and_the_trainers_f32_t_finds_its_own() {
        let turbo = crate::model::timesteps::turbo_timesteps(3.0).map(|t| t as f32).to_vec();
        let (t_09, t_03) = (turbo[2], turbo[7]);
        let events = [started(Some(turbo.clone())), step(1, 0, &[(t_09, 2.0), (t_03, 5.0), (t_09, 4.0)])];
        let r = loss_by_noise_level(&events);
        assert!(r.fixed);
        let mut ascending: Vec<f64> = turbo.iter().map(|&t| t as f64).collect();
        ascending.reverse();
        assert_eq!(r.levels, ascending);
        assert_eq!(r.epochs.len(), 1, "one epoch: nothing to compare it with");
        let means = &r.epochs[0].means;
        assert_eq!(means[0], Some(5.0), "t = 0.3 is the lowest level");
        assert_eq!(means[5], Some(3.0), "t = 0.9");
        assert_eq!(means.iter().flatten().count(), 2);
    }

    #[test]
    fn redone_steps_replace_earlier_ones_and_older_logs_have_nothing_to_show() {
        // Crash after step 3, resume from the checkpoint at step 1: steps 2-3 again.
        let events = [
            started(None),
            step(1, 0, &[(0.1, 1.0)]),
            step(2, 0, &[(0.1, 100.0)]),
            step(3, 1, &[(0.1, 100.0)]),
            started(None),
            step(2, 0, &[(0.1, 3.0)]),
            step(3, 1, &[(0.9, 7.0)]),
        ];
        let r = loss_by_noise_level(&events);
        assert_eq!(r.epochs[0].means[0], Some(2.0));
        assert_eq!(r.epochs[1].means[0], None);
        assert_eq!(r.epochs[1].means[7], Some(7.0));
        // Steps without per-sample losses (logs from before them).
        let old = loss_by_noise_level(&[step(1, 0, &[]), step(2, 1, &[])]);
        assert!(old.epochs.is_empty() && !old.fixed && old.levels.len() == SPANS);
    }
}
