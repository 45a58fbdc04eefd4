//! Duration literals (`60`, `0.5`, `"500ms"`, `"1.5s"`, `"5m"`, `"1h"`) → exact milliseconds.
//!
//! Pure text in, numbers out: no tokens, no spans, no limits. Whether a value is allowed (zero,
//! negative, sub-millisecond, too long) is a rule, checked in [`crate::valid`]. Decimals are
//! converted exactly, without floating point, so that `1.1` seconds is 1100 ms and a fraction of
//! a millisecond is seen rather than rounded away.

/// The accepted duration forms, quoted in every duration error.
pub(crate) const DURATION_FORMS: &str = "seconds as a number (`60`, `0.5`) or a string with a \
                                         unit (`\"500ms\"`, `\"2s\"`, `\"1.5s\"`, `\"5m\"`, \
                                         `\"1h\"`)";

/// A duration in milliseconds, as an exact decimal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Millis {
    /// The whole milliseconds, saturated at `u64::MAX`: a value that large is past every limit,
    /// and the rules report it as too long.
    pub(crate) whole: u64,
    /// Whether there is a fraction of a millisecond beyond `whole`.
    pub(crate) fraction: bool,
}

impl Millis {
    /// Whether the value is exactly zero.
    pub(crate) fn is_zero(self) -> bool {
        self.whole == 0 && !self.fraction
    }
}

/// Why a duration text does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Problem {
    /// Not a number with an accepted unit.
    Unparsable,
    /// A string without unit, like `"60"`.
    MissingUnit(String),
    /// A string with an unknown unit, like `"5d"`.
    UnknownUnit(String),
}

impl Problem {
    /// The message for `name = written`, saying what to write instead.
    pub(crate) fn message(&self, name: &str, written: &str) -> String {
        match self {
            Problem::Unparsable => {
                format!("`{name} = {written}` is not a duration: write {DURATION_FORMS}")
            }
            Problem::MissingUnit(number) => format!(
                "`{name} = {written}` has no unit: write `{name} = \"{number}s\"` or \
                 `{name} = {number}` for seconds, or `\"{number}ms\"` for milliseconds"
            ),
            Problem::UnknownUnit(unit) => format!(
                "unknown unit `{unit}` in `{name} = {written}`: the units are `ms`, `s`, `m` \
                 and `h`, as in `\"500ms\"`, `\"2s\"`, `\"5m\"`, `\"1h\"`"
            ),
        }
    }
}

/// Parses a number of seconds as Rust lexes a numeric literal (`60`, `0.5`, `1e3`, `1_000`),
/// without its sign.
pub(crate) fn parse_seconds(digits: &str) -> Result<Millis, Problem> {
    parse_number(digits, 1000)
}

/// Parses `"<number><unit>"`, e.g. `"500ms"`, `"1.5s"`, `"5 m"`. A leading `-` is accepted and
/// ignored here: the caller sees it in the text and reports a negative duration as a rule.
pub(crate) fn parse_with_unit(text: &str) -> Result<Millis, Problem> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+'))
        .unwrap_or(text.len());
    let (number, unit) = (text[..split].trim(), text[split..].trim());
    let number_unsigned = number.strip_prefix('-').unwrap_or(number);
    let unit_millis = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "" if is_decimal(number_unsigned) => return Err(Problem::MissingUnit(number.to_owned())),
        "" => return Err(Problem::Unparsable),
        other if is_decimal(number_unsigned) && other.chars().all(char::is_alphabetic) => {
            return Err(Problem::UnknownUnit(other.to_owned()))
        }
        _ => return Err(Problem::Unparsable),
    };
    if !is_decimal(number_unsigned) {
        return Err(Problem::Unparsable);
    }
    parse_number(number_unsigned, unit_millis)
}

fn is_decimal(text: &str) -> bool {
    let mut parts = text.splitn(2, '.');
    let whole = parts.next().unwrap_or_default();
    let fraction = parts.next();
    let digits = |part: &str| part.chars().all(|c| c.is_ascii_digit());
    match fraction {
        None => !whole.is_empty() && digits(whole),
        Some(fraction) => {
            (!whole.is_empty() || !fraction.is_empty()) && digits(whole) && digits(fraction)
        }
    }
}

/// The value for a number too large to compute exactly: past every limit, so only its size
/// matters.
const SATURATED: Millis = Millis {
    whole: u64::MAX,
    fraction: false,
};

/// Converts a non-negative decimal number (`60`, `0.5`, `1e3`, `2.5E-1`) of a unit worth
/// `unit_millis` milliseconds into exact milliseconds.
fn parse_number(text: &str, unit_millis: u128) -> Result<Millis, Problem> {
    let text = text.replace('_', "");
    let (mantissa_text, exponent) = match text.find(['e', 'E']) {
        Some(at) => {
            let exponent: i32 = text[at + 1..].parse().map_err(|_| Problem::Unparsable)?;
            (&text[..at], exponent)
        }
        None => (text.as_str(), 0),
    };
    if !is_decimal(mantissa_text) {
        return Err(Problem::Unparsable);
    }
    let (whole, fraction) = mantissa_text.split_once('.').unwrap_or((mantissa_text, ""));
    let digits = format!("{whole}{fraction}");
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        return Ok(Millis {
            whole: 0,
            fraction: false,
        });
    }
    let Ok(fraction_len) = i32::try_from(fraction.len()) else {
        return Ok(SATURATED);
    };
    // value = digits × 10^(exponent − fraction_len) units.
    let scale = exponent.saturating_sub(fraction_len);
    if digits.len() > 30 || scale > 30 {
        return Ok(SATURATED);
    }
    let Ok(mantissa) = digits.parse::<u128>() else {
        return Ok(SATURATED);
    };
    let Some(scaled) = mantissa.checked_mul(unit_millis) else {
        return Ok(SATURATED);
    };
    let (whole, fraction) = if scale >= 0 {
        let factor = 10u128.pow(scale.unsigned_abs());
        match scaled.checked_mul(factor) {
            Some(whole) => (whole, false),
            None => return Ok(SATURATED),
        }
    } else if scale < -38 {
        (0, scaled != 0)
    } else {
        let divisor = 10u128.pow(scale.unsigned_abs());
        (scaled / divisor, scaled % divisor != 0)
    };
    Ok(Millis {
        whole: u64::try_from(whole).unwrap_or(u64::MAX),
        fraction,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(clippy::unnecessary_wraps)] // compared with `Result`s
    fn whole(millis: u64) -> Result<Millis, Problem> {
        Ok(Millis {
            whole: millis,
            fraction: false,
        })
    }

    #[test]
    fn seconds_as_numbers() {
        assert_eq!(parse_seconds("60"), whole(60_000));
        assert_eq!(parse_seconds("0"), whole(0));
        assert_eq!(parse_seconds("0.5"), whole(500));
        assert_eq!(parse_seconds("1.1"), whole(1_100));
        assert_eq!(parse_seconds(".25"), whole(250));
        assert_eq!(parse_seconds("1e3"), whole(1_000_000));
        assert_eq!(parse_seconds("2.5E-1"), whole(250));
        assert_eq!(parse_seconds("1_000"), whole(1_000_000));
        assert_eq!(
            parse_seconds("0.0005"),
            Ok(Millis {
                whole: 0,
                fraction: true
            })
        );
        assert_eq!(
            parse_seconds("1.0005"),
            Ok(Millis {
                whole: 1_000,
                fraction: true
            })
        );
        assert_eq!(
            parse_seconds("1e-50"),
            Ok(Millis {
                whole: 0,
                fraction: true
            })
        );
    }

    #[test]
    fn strings_with_units() {
        assert_eq!(parse_with_unit("500ms"), whole(500));
        assert_eq!(parse_with_unit("2s"), whole(2_000));
        assert_eq!(parse_with_unit("1.5s"), whole(1_500));
        assert_eq!(parse_with_unit("5m"), whole(300_000));
        assert_eq!(parse_with_unit("0.5m"), whole(30_000));
        assert_eq!(parse_with_unit("1h"), whole(3_600_000));
        assert_eq!(parse_with_unit("9000h"), whole(32_400_000_000));
        assert_eq!(parse_with_unit(" 10 s "), whole(10_000));
        assert_eq!(parse_with_unit("0s"), whole(0));
        assert_eq!(parse_with_unit("-1s"), whole(1_000));
        assert_eq!(
            parse_with_unit("1.5ms"),
            Ok(Millis {
                whole: 1,
                fraction: true
            })
        );
    }

    #[test]
    fn bad_strings() {
        assert_eq!(
            parse_with_unit("60"),
            Err(Problem::MissingUnit("60".into()))
        );
        assert_eq!(parse_with_unit("5d"), Err(Problem::UnknownUnit("d".into())));
        assert_eq!(
            parse_with_unit("5 minutes"),
            Err(Problem::UnknownUnit("minutes".into()))
        );
        for text in [
            "", "soon", "ms", "1..2s", "1.2.3s", "s5", "1s2", "--1s", ".", "1e5s", "{}s",
        ] {
            assert_eq!(parse_with_unit(text), Err(Problem::Unparsable), "{text:?}");
        }
    }

    #[test]
    fn huge_values_saturate() {
        for text in [
            "99999999999999999999999",
            "1e40",
            "1e2147483647",
            &"9".repeat(10_000),
        ] {
            assert_eq!(parse_seconds(text), Ok(SATURATED), "{text:.20}");
        }
        assert_eq!(parse_with_unit("9999999999999999h"), Ok(SATURATED));
        assert_eq!(parse_seconds("18446744073709551.615"), whole(u64::MAX));
        assert_eq!(parse_seconds("0e40"), whole(0));
        assert_eq!(parse_seconds("0.000e99999"), whole(0));
    }

    #[test]
    fn exponents_that_do_not_fit_are_unparsable() {
        assert_eq!(parse_seconds("1e99999999999"), Err(Problem::Unparsable));
        assert_eq!(parse_seconds("1e"), Err(Problem::Unparsable));
    }

    #[test]
    fn problems_say_what_to_write() {
        let message = Problem::MissingUnit("60".into()).message("ttl", "\"60\"");
        assert!(message.contains("`ttl = \"60s\"`"), "{message}");
        let message = Problem::UnknownUnit("d".into()).message("timeout", "\"5d\"");
        assert!(message.contains("the units are `ms`"), "{message}");
        let message = Problem::Unparsable.message("ttl", "\"soon\"");
        assert!(message.contains(DURATION_FORMS), "{message}");
    }
}
