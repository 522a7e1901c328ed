//! Deserializers that take exactly one YAML type, for the keys of config.yaml.
//!
//! serde-saphyr, like most YAML readers, is lenient when the target type is known: a boolean
//! target takes the quoted string `"no"`, a number target takes `"12"`, a string target takes
//! `1000` or `yes` as their text, and an untagged string-or-list takes a single word where a
//! list is documented. Each of those hides a mistake (`redact_output: "no"` read as `false`
//! looks right but is a string), so these helpers read the value with `deserialize_any` — which
//! reports a quoted scalar as a string and types a plain one (bool, integer, float, string) —
//! and accept only the one shape the key is documented to hold. Plain YAML 1.1 booleans
//! (`yes`, `no`, `on`, `off`) are still booleans: the parser types them so, and the docs use
//! them (`approvals.mode: off`).
//!
//! Use them as `#[serde(default, deserialize_with = "crate::config_types::opt_bool")]` on `Option` fields;
//! the field names and types of the config structs stay as they were.

use serde::de::{self, Deserialize, Deserializer, Unexpected, Visitor};
use std::fmt;
use std::path::PathBuf;

/// A boolean written as a plain `true`/`false` (or a YAML 1.1 spelling such as `off`).
struct Bool(bool);

impl<'de> Deserialize<'de> for Bool {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Bool;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("true or false, unquoted")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Bool, E> {
                Ok(Bool(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// A string: a quoted scalar or a plain one YAML does not read as a boolean or a number.
struct Text(String);

/// What a string key says when it finds a boolean or a number: YAML typed it, so quoting is
/// the fix.
const TEXT_EXPECTED: &str =
    "a string (quote values YAML reads as a number or a boolean, e.g. \"1000\" or \"yes\")";

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Text;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(TEXT_EXPECTED)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Text, E> {
                Ok(Text(v.to_owned()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Text, E> {
                Ok(Text(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// A whole number ≥ 0, unquoted.
struct Unsigned(u64);

impl<'de> Deserialize<'de> for Unsigned {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Unsigned;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a whole number ≥ 0 (u64), unquoted")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Unsigned, E> {
                Ok(Unsigned(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Unsigned, E> {
                u64::try_from(v)
                    .map(Unsigned)
                    .map_err(|_| E::invalid_value(Unexpected::Signed(v), &self))
            }
            /// A whole number past the 64-bit range arrives as a float: said as the number it
            /// was written as (too large, or negative), not as "invalid type: floating point
            /// `18446744073709552000.0`".
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Unsigned, E> {
                const TWO_POW_64: f64 = 18_446_744_073_709_551_616.0;
                if v.fract() == 0.0 && v >= TWO_POW_64 {
                    Err(E::custom(format!(
                        "the number is too large: a whole number from 0 to {} is expected",
                        u64::MAX
                    )))
                } else if v.fract() == 0.0 && v < 0.0 {
                    Err(E::custom(format!(
                        "the number is negative: a whole number from 0 to {} is expected",
                        u64::MAX
                    )))
                } else {
                    Err(E::invalid_type(Unexpected::Float(v), &self))
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// A number (integer or decimal), unquoted.
struct Number(f64);

impl<'de> Deserialize<'de> for Number {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Number;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a number, unquoted")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Number, E> {
                Ok(Number(v as f64))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Number, E> {
                Ok(Number(v as f64))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Number, E> {
                Ok(Number(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// A list of strings: a YAML sequence (never a single scalar) whose entries are strings.
struct TextList(Vec<String>);

impl<'de> Deserialize<'de> for TextList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = TextList;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of strings, e.g. [a, b] (a single entry is written [a])")
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<TextList, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
                while let Some(Text(s)) = seq.next_element()? {
                    out.push(s);
                }
                Ok(TextList(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// `Option<bool>`: `null` or absent is `None`; only a plain boolean is accepted.
pub fn opt_bool<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    Ok(Option::<Bool>::deserialize(d)?.map(|b| b.0))
}

/// `Option<String>`: only a string is accepted (not `1000` or `yes` unquoted).
pub fn opt_string<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(Option::<Text>::deserialize(d)?.map(|t| t.0))
}

/// `Option<PathBuf>`: a path, taken as [`opt_string`] takes a string.
pub fn opt_path<'de, D: Deserializer<'de>>(d: D) -> Result<Option<PathBuf>, D::Error> {
    Ok(opt_string(d)?.map(PathBuf::from))
}

/// `Option<Vec<String>>`: only a list of strings is accepted (not a single scalar, not
/// numbers).
pub fn opt_string_list<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    Ok(Option::<TextList>::deserialize(d)?.map(|l| l.0))
}

/// `Option<u64>`: only an unquoted whole number ≥ 0.
pub fn opt_u64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Ok(Option::<Unsigned>::deserialize(d)?.map(|n| n.0))
}

/// `Option<f64>`: only an unquoted number.
pub fn opt_f64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    Ok(Option::<Number>::deserialize(d)?.map(|n| n.0))
}

/// `Vec<PathBuf>` (absent or `null`: empty): only a list of strings.
pub fn path_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<PathBuf>, D::Error> {
    Ok(opt_string_list(d)?
        .unwrap_or_default()
        .into_iter()
        .map(PathBuf::from)
        .collect())
}

/// `logging.level`: a string, or the plain `off` that YAML 1.1 reads as `false` (taken as
/// `off`). `true` is refused: it names no level.
pub fn opt_level<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    struct Level(String);
    impl<'de> Deserialize<'de> for Level {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl Visitor<'_> for V {
                type Value = Level;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("a level: error, warn, info, debug, trace or off")
                }
                fn visit_bool<E: de::Error>(self, v: bool) -> Result<Level, E> {
                    if v {
                        Err(E::invalid_value(Unexpected::Bool(v), &self))
                    } else {
                        Ok(Level("off".into()))
                    }
                }
                fn visit_str<E: de::Error>(self, v: &str) -> Result<Level, E> {
                    Ok(Level(v.to_owned()))
                }
            }
            d.deserialize_any(V)
        }
    }
    Ok(Option::<Level>::deserialize(d)?.map(|l| l.0))
}
