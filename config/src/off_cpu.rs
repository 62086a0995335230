//! Off-CPU settings: how many context switches are recorded, and from how
//! long a wait on.

use std::time::Duration;

use crate::validate::Invalid;

/// A probability from 0 to 1, never NaN (which is what makes it `Eq`).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Probability(f64);

impl Eq for Probability {}

impl Probability {
    /// The value, from 0 to 1.
    pub fn get(self) -> f64 {
        self.0
    }
}

/// Off-CPU profiling, when on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffCpuConfig {
    /// The share of context switches recorded, in (0, 1]; each recorded
    /// wait stands for 1/probability waits.
    pub probability: Probability,
    /// Shorter waits are not recorded.
    pub min_duration: Duration,
}

/// Default of `off_cpu_min_duration`: waits shorter than a microsecond
/// (a lock handed over at once, a yield) cost only the filter.
pub const DEFAULT_OFF_CPU_MIN_DURATION: Duration = Duration::from_micros(1);
/// Longest `off_cpu_min_duration` accepted.
pub const MAX_OFF_CPU_MIN_DURATION: Duration = Duration::from_secs(60);

const EXPECTED_THRESHOLD: &str = "a number from 0 (off) to 1 (every context switch), like 0.01";
const EXPECTED_MIN_DURATION: &str = "a duration up to 1m, like 1us or 2ms";

/// Parses `off_cpu_threshold`: a probability from 0 to 1.
pub(crate) fn threshold(text: &str) -> Result<Probability, Invalid> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| Invalid::new(EXPECTED_THRESHOLD))?;
    if !(0.0..=1.0).contains(&value) {
        return Err(Invalid::because(EXPECTED_THRESHOLD, "out of range"));
    }
    Ok(Probability(value))
}

/// Parses `off_cpu_min_duration`.
pub(crate) fn min_duration(text: &str) -> Result<Duration, Invalid> {
    let duration = humantime::parse_duration(text.trim())
        .map_err(|e| Invalid::because(EXPECTED_MIN_DURATION, e.to_string()))?;
    if duration > MAX_OFF_CPU_MIN_DURATION {
        return Err(Invalid::because(
            EXPECTED_MIN_DURATION,
            "above the maximum of 1m",
        ));
    }
    Ok(duration)
}

/// The off-CPU config of the resolved settings: `None` when the threshold
/// is 0 or unset.
pub(crate) fn resolve(
    threshold: Option<Probability>,
    min: Option<Duration>,
) -> Option<OffCpuConfig> {
    let probability = threshold.filter(|p| p.0 > 0.0)?;
    Some(OffCpuConfig {
        probability,
        min_duration: min.unwrap_or(DEFAULT_OFF_CPU_MIN_DURATION),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_are_probabilities() {
        assert_eq!(threshold("0.01").ok(), Some(Probability(0.01)));
        assert_eq!(threshold(" 1 ").ok(), Some(Probability(1.0)));
        assert_eq!(threshold("0").ok(), Some(Probability(0.0)));
        for bad in ["-0.1", "1.5", "NaN", "inf", "", "1%"] {
            assert!(threshold(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn min_durations_are_bounded() {
        assert_eq!(min_duration("1us").ok(), Some(Duration::from_micros(1)));
        assert_eq!(min_duration("0s").ok(), Some(Duration::ZERO));
        assert!(min_duration("2m").is_err());
        assert!(min_duration("5").is_err());
    }

    #[test]
    fn zero_turns_it_off() {
        assert_eq!(resolve(Some(Probability(0.0)), None), None);
        assert_eq!(resolve(None, Some(Duration::from_millis(1))), None);
        let on = resolve(Some(Probability(0.5)), None).expect("on");
        assert_eq!(on.min_duration, DEFAULT_OFF_CPU_MIN_DURATION);
    }
}
