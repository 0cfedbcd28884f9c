//! Integer formats the API server knows. schemars names Rust's integer types
//! (`uint16`, `uint32`), which OpenAPI does not define and the API server warns about
//! on every CRD apply (`unrecognized format "uint32"`); Kubernetes knows `int32` and
//! `int64` only. Each is rewritten to the narrowest of those two that holds every value
//! of the type, and the type's range becomes `minimum`/`maximum`, so the bound the
//! Rust type enforced at decoding is still enforced by the API server.

use schemars::Schema;
use schemars::transform::transform_subschemas;
use serde_json::{Value, json};

/// The Kubernetes format and the range of a schemars integer format; `None` for a
/// format that needs no rewrite.
fn kubernetes_integer(format: &str) -> Option<(&'static str, i64, i64)> {
    Some(match format {
        "int8" => ("int32", i8::MIN.into(), i8::MAX.into()),
        "int16" => ("int32", i16::MIN.into(), i16::MAX.into()),
        "uint8" => ("int32", 0, u8::MAX.into()),
        "uint16" => ("int32", 0, u16::MAX.into()),
        "uint32" => ("int64", 0, u32::MAX.into()),
        // Wider than int64 can say: the API server's integers are int64.
        "uint64" | "uint" => ("int64", 0, i64::MAX),
        _ => return None,
    })
}

/// A schemars transform: rewrites every integer format below `schema` (see the module).
pub fn kubernetes_formats(schema: &mut Schema) {
    transform_subschemas(&mut kubernetes_formats, schema);
    let Some(object) = schema.as_object_mut() else {
        return;
    };
    let Some((format, min, max)) = object
        .get("format")
        .and_then(Value::as_str)
        .and_then(kubernetes_integer)
    else {
        return;
    };
    object.insert("format".into(), json!(format));
    // A tighter bound already written (`#[schemars(range)]`) stays.
    let tighter = |existing: Option<&Value>, bound: i64, keep_if: fn(f64, f64) -> bool| {
        existing
            .filter(|e| e.as_f64().is_some_and(|e| keep_if(e, bound as f64)))
            .cloned()
            .unwrap_or_else(|| json!(bound))
    };
    let minimum = tighter(object.get("minimum"), min, |e, b| e >= b);
    let maximum = tighter(object.get("maximum"), max, |e, b| e <= b);
    object.insert("minimum".into(), minimum);
    object.insert("maximum".into(), maximum);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsigned_formats_become_kubernetes_ones_with_their_range() {
        let mut schema = schemars::json_schema!({
            "type": "object",
            "properties": {
                "count": {"type": "integer", "format": "uint32", "minimum": 0.0},
                "slots": {"type": "array", "items": {"type": "integer", "format": "uint16"}},
                "small": {"type": "integer", "format": "uint16", "minimum": 1, "maximum": 18},
                "generation": {"type": "integer", "format": "int64"},
            }
        });
        kubernetes_formats(&mut schema);
        let properties = &schema.as_value()["properties"];
        assert_eq!(
            properties["count"],
            json!({"type": "integer", "format": "int64", "minimum": 0.0, "maximum": 4294967295i64})
        );
        assert_eq!(
            properties["slots"]["items"],
            json!({"type": "integer", "format": "int32", "minimum": 0, "maximum": 65535})
        );
        assert_eq!(
            properties["small"],
            json!({"type": "integer", "format": "int32", "minimum": 1, "maximum": 18})
        );
        assert_eq!(
            properties["generation"],
            json!({"type": "integer", "format": "int64"}),
            "a Kubernetes format is left alone"
        );
    }
}
