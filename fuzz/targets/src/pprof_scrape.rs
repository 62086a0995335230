//! A pprof profile as a scrape target serves it (Go's `net/http/pprof`),
//! through what the agent's scrape loop and sinks do with it:
//! `scrape::decode` (gzip or plain, bounded, structurally checked),
//! `CumulativeDelta::apply` over three scrapes (a baseline, the same
//! profile with its values doubled, then the first again so counts go
//! down), `ScrapedProfile::new` (re-encoded, gzipped) and the OTLP, Parca
//! and Pyroscope encodings of each profile that is ready.

use icecore_otlp::otlp_encode::encode_pprof_request;
use icecore_otlp::pprof::Profile;
use icecore_otlp::scrape::{CumulativeDelta, DeltaOutcome, ScrapedProfile, decode};
use icecore_otlp::{ParcaExporter, PyroscopeExporter, ResourceAttributes};

fn deliver(profile: Profile) {
    let labels = vec![
        ("job".to_owned(), "checkout".to_owned()),
        ("instance".to_owned(), "127.0.0.1:6060".to_owned()),
    ];
    let mut scraped = ScrapedProfile::new("memory".to_owned(), labels, profile);
    scraped.add_missing_labels(&[("env", "production")]);
    let _ = scraped.sample_count();
    let _ = scraped.time_unix_nanos();
    let _ = encode_pprof_request(
        &scraped.profile,
        &scraped.name,
        &scraped.labels,
        "fuzz",
        &ResourceAttributes::default(),
    );
    let _ = ParcaExporter::encode_scraped(&scraped);
    let _ = PyroscopeExporter::encode_scraped(&scraped);
}

/// Runs one input through the entry points above; panics are the bugs
/// looked for (errors are expected answers to bad input).
pub fn run(data: &[u8]) {
    let profile = match decode(data) {
        Ok(profile) => profile,
        Err(e) => {
            let _ = e.to_string();
            let _ = e.reason();
            return;
        }
    };
    let mut doubled = profile.clone();
    for sample in &mut doubled.sample {
        for v in &mut sample.value {
            *v = v.wrapping_mul(2);
        }
    }
    let mut delta = CumulativeDelta::default();
    for next in [profile.clone(), doubled, profile] {
        if let DeltaOutcome::Ready(ready) = delta.apply(next) {
            deliver(*ready);
        }
    }
}
