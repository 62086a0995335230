//! The agent's log lines on stderr, as `--log-format` asks: text (colours
//! on a terminal only), one JSON object per line, or logfmt; and, with
//! `--self-traces`, its spans as OTLP traces too (see `self_traces`).

use std::fmt;
use std::io::IsTerminal;

use icecore_config::LogFormat;
use tracing::{Event, Subscriber, field::Field};
use tracing_subscriber::{
    EnvFilter, Layer,
    fmt::{
        FmtContext, FormatEvent, FormatFields, format::Writer, time::FormatTime, time::SystemTime,
    },
    layer::SubscriberExt,
    registry::LookupSpan,
    util::SubscriberInitExt,
};

/// Installs the global subscriber: `filter` (a level or `EnvFilter`
/// directives), lines in `format`, and `extra` (the traces layer) if any.
pub fn init<L>(filter: &str, format: LogFormat, extra: Option<L>)
where
    L: Layer<tracing_subscriber::Registry> + Send + Sync,
{
    let filter = EnvFilter::try_new(filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let lines = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let lines = match format {
        // Colour codes only on a terminal: journald and log files get plain text.
        LogFormat::Text => lines.with_ansi(std::io::stderr().is_terminal()).boxed(),
        LogFormat::Json => lines
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .boxed(),
        LogFormat::Logfmt => lines.event_format(Logfmt).boxed(),
    };
    tracing_subscriber::registry()
        .with(extra)
        .with(lines.with_filter(filter))
        .init();
}

/// `ts=… level=info target=icecore msg="…" key=value …`, one event a line.
struct Logfmt;

impl<S, N> FormatEvent<S, N> for Logfmt
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        write!(writer, "ts=")?;
        SystemTime.format_time(&mut writer)?;
        let meta = event.metadata();
        write!(
            writer,
            " level={} target={}",
            meta.level().as_str().to_ascii_lowercase(),
            meta.target()
        )?;
        let mut fields = LogfmtFields {
            writer: &mut writer,
            result: Ok(()),
        };
        event.record(&mut fields);
        fields.result?;
        writeln!(writer)
    }
}

/// Writes each field as ` key=value`, quoting values that need it.
struct LogfmtFields<'a, 'w> {
    writer: &'a mut Writer<'w>,
    result: fmt::Result,
}

impl tracing::field::Visit for LogfmtFields<'_, '_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if self.result.is_ok() {
            self.result = write_pair(self.writer, field.name(), value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.record_str(field, &format!("{value:?}"));
    }
}

fn write_pair(writer: &mut Writer<'_>, key: &str, value: &str) -> fmt::Result {
    let key = if key == "message" { "msg" } else { key };
    write!(writer, " {key}=")?;
    let bare = !value.is_empty()
        && value
            .chars()
            .all(|c| c.is_ascii_graphic() && c != '"' && c != '=' && c != '\\');
    if bare {
        return write!(writer, "{value}");
    }
    write!(writer, "\"")?;
    for c in value.chars() {
        match c {
            '"' => write!(writer, "\\\"")?,
            '\\' => write!(writer, "\\\\")?,
            '\n' => write!(writer, "\\n")?,
            c if c.is_control() => write!(writer, "\\u{{{:04x}}}", c as u32)?,
            c => write!(writer, "{c}")?,
        }
    }
    write!(writer, "\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(key: &str, value: &str) -> String {
        let mut out = String::new();
        write_pair(&mut Writer::new(&mut out), key, value).unwrap();
        out
    }

    #[test]
    fn logfmt_values_are_quoted_when_they_must_be() {
        assert_eq!(pair("pid", "42"), " pid=42");
        assert_eq!(
            pair("message", "icecore starting"),
            " msg=\"icecore starting\""
        );
        assert_eq!(pair("path", "a=b"), " path=\"a=b\"");
        assert_eq!(pair("text", "say \"hi\"\n"), " text=\"say \\\"hi\\\"\\n\"");
        assert_eq!(pair("empty", ""), " empty=\"\"");
    }
}
