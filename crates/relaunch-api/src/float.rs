//! How metric values travel in JSON: finite numbers as JSON numbers, NaN
//! and the infinities as the strings `"NaN"`, `"Infinity"` and
//! `"-Infinity"` (JSON has no literal for them, and `serde_json` would
//! write `null`, which reads back as nothing at all). Reading accepts the
//! same, and `null` as NaN (what older servers wrote).

use serde::de::{self, Deserializer, Visitor};
use serde::{Serialize as _, Serializer};

/// The JSON string of a non-finite value; `None` for a finite one.
pub fn non_finite_name(value: f64) -> Option<&'static str> {
    if value.is_nan() {
        Some("NaN")
    } else if value == f64::INFINITY {
        Some("Infinity")
    } else if value == f64::NEG_INFINITY {
        Some("-Infinity")
    } else {
        None
    }
}

/// For `#[serde(with = "crate::float")]` on an `f64` field.
pub fn serialize<S: Serializer>(value: &f64, serializer: S) -> Result<S::Ok, S::Error> {
    match non_finite_name(*value) {
        Some(name) => name.serialize(serializer),
        None => value.serialize(serializer),
    }
}

pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
    deserializer.deserialize_any(FloatVisitor)
}

struct FloatVisitor;

impl Visitor<'_> for FloatVisitor {
    type Value = f64;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a number, or \"NaN\", \"Infinity\" or \"-Infinity\"")
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<f64, E> {
        Ok(v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<f64, E> {
        Ok(v as f64)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<f64, E> {
        Ok(v as f64)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<f64, E> {
        match v {
            "NaN" => Ok(f64::NAN),
            "Infinity" => Ok(f64::INFINITY),
            "-Infinity" => Ok(f64::NEG_INFINITY),
            _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
        }
    }

    fn visit_unit<E: de::Error>(self) -> Result<f64, E> {
        Ok(f64::NAN)
    }

    fn visit_none<E: de::Error>(self) -> Result<f64, E> {
        Ok(f64::NAN)
    }
}

#[cfg(test)]
mod tests {
    #[derive(Debug, serde::Serialize, serde::Deserialize)]
    struct V(#[serde(with = "super")] f64);

    #[test]
    fn every_value_round_trips_through_json() {
        for (value, json) in [
            (1.5, "1.5"),
            (-0.0, "-0.0"),
            (f64::NAN, "\"NaN\""),
            (f64::INFINITY, "\"Infinity\""),
            (f64::NEG_INFINITY, "\"-Infinity\""),
            (f64::MAX, "1.7976931348623157e+308"),
        ] {
            let text = serde_json::to_string(&V(value)).unwrap();
            assert_eq!(text, json);
            let back: V = serde_json::from_str(&text).unwrap();
            assert_eq!(back.0.to_bits(), value.to_bits(), "{json}");
        }
        assert!(serde_json::from_str::<V>("null").unwrap().0.is_nan());
        assert_eq!(serde_json::from_str::<V>("3").unwrap().0, 3.0);
        let err = serde_json::from_str::<V>("\"nan\"").unwrap_err();
        assert!(err.to_string().contains("\"Infinity\""), "{err}");
    }
}
