//! Checks an `ExportProfilesServiceRequest` from outside before anything
//! forwards or converts it: every dictionary index in range, every sample
//! well-formed, totals bounded. The first problem found is reported with
//! the path of the offending field.

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::profiles::v1development::{ProfilesDictionary, Sample};

/// Bounds on what one request may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiveLimits {
    /// Largest accepted request, in bytes after decompression.
    pub max_message_bytes: usize,
    /// Most samples (timestamps, or summed values) in one request.
    pub max_samples: u64,
    /// Most frames in one stack.
    pub max_stack_depth: usize,
}

impl Default for ReceiveLimits {
    /// 16 MiB, 2 million samples and 4096 frames: a 10 s batch of a busy
    /// 128-CPU host at 997 Hz holds 1.3 million samples. Converting a request
    /// costs 8 bytes per sample, so the sample bound also bounds memory.
    fn default() -> Self {
        Self {
            max_message_bytes: 16 << 20,
            max_samples: 2_000_000,
            max_stack_depth: 4096,
        }
    }
}

/// Why a request is refused; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidProfiles(pub String);

/// Samples the request carries (timestamps, or summed values when a sample
/// has only values), once it is known to be valid.
pub fn validate(
    request: &ExportProfilesServiceRequest,
    limits: &ReceiveLimits,
) -> Result<u64, InvalidProfiles> {
    let empty = ProfilesDictionary::default();
    let has_profiles = request
        .resource_profiles
        .iter()
        .flat_map(|r| &r.scope_profiles)
        .any(|s| !s.profiles.is_empty());
    let dict = match &request.dictionary {
        Some(dict) => dict,
        None if has_profiles => {
            return Err(InvalidProfiles(
                "the request has profiles but no dictionary".into(),
            ));
        }
        None => &empty,
    };
    check_dictionary(dict, limits)?;
    let mut total: u64 = 0;
    for (r, resource) in request.resource_profiles.iter().enumerate() {
        for (s, scope) in resource.scope_profiles.iter().enumerate() {
            for (p, profile) in scope.profiles.iter().enumerate() {
                let at = format!("resource_profiles[{r}].scope_profiles[{s}].profiles[{p}]");
                for vt in [&profile.sample_type, &profile.period_type]
                    .into_iter()
                    .flatten()
                {
                    index(
                        &at,
                        "value type type_strindex",
                        vt.type_strindex,
                        dict.string_table.len(),
                    )?;
                    index(
                        &at,
                        "value type unit_strindex",
                        vt.unit_strindex,
                        dict.string_table.len(),
                    )?;
                }
                for &a in &profile.attribute_indices {
                    index(&at, "attribute_indices", a, dict.attribute_table.len())?;
                }
                for (i, sample) in profile.samples.iter().enumerate() {
                    let count = check_sample(&format!("{at}.samples[{i}]"), sample, dict)?;
                    total = total.saturating_add(count);
                    if total > limits.max_samples {
                        return Err(InvalidProfiles(format!(
                            "the request holds more than {} samples",
                            limits.max_samples
                        )));
                    }
                }
            }
        }
    }
    Ok(total)
}

fn check_sample(
    at: &str,
    sample: &Sample,
    dict: &ProfilesDictionary,
) -> Result<u64, InvalidProfiles> {
    index(
        at,
        "stack_index",
        sample.stack_index,
        dict.stack_table.len(),
    )?;
    index(at, "link_index", sample.link_index, dict.link_table.len())?;
    for &a in &sample.attribute_indices {
        index(at, "attribute_indices", a, dict.attribute_table.len())?;
    }
    let (values, timestamps) = (&sample.values, &sample.timestamps_unix_nano);
    if values.is_empty() && timestamps.is_empty() {
        return Err(InvalidProfiles(format!(
            "{at} has neither values nor timestamps_unix_nano"
        )));
    }
    if !values.is_empty() && !timestamps.is_empty() && values.len() != timestamps.len() {
        return Err(InvalidProfiles(format!(
            "{at} has {} values but {} timestamps_unix_nano",
            values.len(),
            timestamps.len()
        )));
    }
    if values.iter().any(|&v| v < 0) {
        return Err(InvalidProfiles(format!("{at}.values has a negative value")));
    }
    Ok(if timestamps.is_empty() {
        values
            .iter()
            .fold(0u64, |sum, &v| sum.saturating_add(v.unsigned_abs()))
    } else {
        timestamps.len() as u64
    })
}

fn check_dictionary(
    dict: &ProfilesDictionary,
    limits: &ReceiveLimits,
) -> Result<(), InvalidProfiles> {
    let strings = dict.string_table.len();
    let attributes = dict.attribute_table.len();
    if dict.string_table.first().is_some_and(|s| !s.is_empty()) {
        return Err(InvalidProfiles(
            "dictionary.string_table[0] must be the empty string".into(),
        ));
    }
    for (i, m) in dict.mapping_table.iter().enumerate() {
        let at = format!("dictionary.mapping_table[{i}]");
        index(&at, "filename_strindex", m.filename_strindex, strings)?;
        for &a in &m.attribute_indices {
            index(&at, "attribute_indices", a, attributes)?;
        }
    }
    for (i, l) in dict.location_table.iter().enumerate() {
        let at = format!("dictionary.location_table[{i}]");
        index(
            &at,
            "mapping_index",
            l.mapping_index,
            dict.mapping_table.len(),
        )?;
        for &a in &l.attribute_indices {
            index(&at, "attribute_indices", a, attributes)?;
        }
        for (j, line) in l.lines.iter().enumerate() {
            index(
                &format!("{at}.lines[{j}]"),
                "function_index",
                line.function_index,
                dict.function_table.len(),
            )?;
        }
    }
    for (i, f) in dict.function_table.iter().enumerate() {
        let at = format!("dictionary.function_table[{i}]");
        index(&at, "name_strindex", f.name_strindex, strings)?;
        index(&at, "system_name_strindex", f.system_name_strindex, strings)?;
        index(&at, "filename_strindex", f.filename_strindex, strings)?;
    }
    for (i, a) in dict.attribute_table.iter().enumerate() {
        let at = format!("dictionary.attribute_table[{i}]");
        index(&at, "key_strindex", a.key_strindex, strings)?;
        index(&at, "unit_strindex", a.unit_strindex, strings)?;
    }
    for (i, s) in dict.stack_table.iter().enumerate() {
        let at = format!("dictionary.stack_table[{i}]");
        if s.location_indices.len() > limits.max_stack_depth {
            return Err(InvalidProfiles(format!(
                "{at} has {} frames, over the limit of {}",
                s.location_indices.len(),
                limits.max_stack_depth
            )));
        }
        for &l in &s.location_indices {
            index(&at, "location_indices", l, dict.location_table.len())?;
        }
    }
    for (i, link) in dict.link_table.iter().enumerate() {
        if !matches!(link.trace_id.len(), 0 | 16) || !matches!(link.span_id.len(), 0 | 8) {
            return Err(InvalidProfiles(format!(
                "dictionary.link_table[{i}] has a trace_id or span_id of the wrong length"
            )));
        }
    }
    Ok(())
}

/// Checks that `value` indexes a table of `len` entries; 0 means "unset"
/// and is always accepted.
fn index(at: &str, field: &str, value: i32, len: usize) -> Result<(), InvalidProfiles> {
    if value < 0 || (value != 0 && value as usize >= len) {
        return Err(InvalidProfiles(format!(
            "dangling index: {at}.{field} = {value}, but the table has {len} entries"
        )));
    }
    Ok(())
}
