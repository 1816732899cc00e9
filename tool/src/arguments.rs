//! Decoding a call's JSON arguments into a typed input.

use serde::de::DeserializeOwned;

use crate::error::{BoxError, ToolError};

/// Decodes the JSON `arguments` of a call to `tool` into `T`.
///
/// This is the default argument decoder of [`FunctionTool`](crate::FunctionTool),
/// public so that hand-written [`Tool`](crate::Tool)s can report bad input the
/// same way. Decoding into `T` *is* the schema check: a syntax error, a
/// missing required field, a wrong type or (with `#[serde(deny_unknown_fields)]`)
/// an unexpected field all become [`ToolError::InvalidArguments`] naming the
/// tool and the serde path of the problem (as `serde_path_to_error` writes
/// it: `.` for the root, `items[1].qty` for a nested field; for a JSON syntax
/// error, the deepest place reached, and the message has line and column).
///
/// Empty or all-whitespace arguments are read as `{}`, since models often
/// send `""` for tools without parameters; and `{}` decodes into a unit type
/// (`()`, `struct NoArgs;`), whose schema is the empty object.
///
/// ```
/// use dtask_tool::{decode_arguments, ToolError};
/// use serde::Deserialize;
///
/// #[derive(Debug, Deserialize)]
/// struct Order { items: Vec<Item> }
/// #[derive(Debug, Deserialize)]
/// struct Item { qty: u32 }
///
/// let err = decode_arguments::<Order>("shop", r#"{"items":[{"qty":1},{"qty":"2"}]}"#)
///     .unwrap_err();
/// match err {
///     ToolError::InvalidArguments { tool, path, .. } => {
///         assert_eq!(tool, "shop");
///         assert_eq!(path, "items[1].qty");
///     }
///     other => panic!("unexpected {other}"),
/// }
/// ```
///
/// # Errors
///
/// [`ToolError::InvalidArguments`] if `arguments` is not JSON or does not
/// decode into `T`.
pub fn decode_arguments<T: DeserializeOwned>(tool: &str, arguments: &str) -> Result<T, ToolError> {
    decode_json::<T>(arguments).map_err(|e| invalid_from_path_error(tool, &e))
}

/// The arguments a call means: none (empty, or only whitespace) are the empty object `{}` —
/// what a streamed call of a tool without parameters sends. The one rule every tool that
/// reads a model's arguments follows (typed functions, the tools node's managed tools, the
/// durable agent's calls).
///
/// ```
/// assert_eq!(dtask_tool::effective_arguments(" "), "{}");
/// assert_eq!(dtask_tool::effective_arguments(r#"{"a":1}"#), r#"{"a":1}"#);
/// ```
#[must_use]
pub fn effective_arguments(arguments: &str) -> &str {
    if arguments.trim().is_empty() {
        "{}"
    } else {
        arguments
    }
}

/// Decodes with `serde_path_to_error`, also rejecting trailing characters.
pub(crate) fn decode_json<T: DeserializeOwned>(
    arguments: &str,
) -> Result<T, serde_path_to_error::Error<serde_json::Error>> {
    let text = effective_arguments(arguments);
    let mut de = serde_json::Deserializer::from_str(text);
    let value: T = match serde_path_to_error::deserialize(&mut de) {
        Ok(value) => value,
        // A tool without parameters whose type is a unit (`()`, `struct NoArgs;`): its schema
        // is the empty object, and `{}` is how a model calls it.
        Err(e) if is_empty_object(text) => match serde_json::from_str::<T>("null") {
            Ok(value) => return Ok(value),
            Err(_) => return Err(e),
        },
        Err(e) => return Err(e),
    };
    // Trailing garbage after a valid value is an error at the root.
    de.end().map_err(|e| {
        serde_path_to_error::Error::new(serde_path_to_error::Track::new().path(), e)
    })?;
    Ok(value)
}

/// Whether `text` is JSON's empty object, whatever its spacing.
fn is_empty_object(text: &str) -> bool {
    serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(text)
        .is_ok_and(|map| map.is_empty())
}

fn invalid_from_path_error(
    tool: &str,
    error: &serde_path_to_error::Error<serde_json::Error>,
) -> ToolError {
    ToolError::invalid_arguments(tool, error.path().to_string(), error.inner().to_string())
}

/// Maps the error of a custom decoder to [`ToolError::InvalidArguments`],
/// keeping the serde path if the decoder used `serde_path_to_error` or
/// returned a [`ToolError::InvalidArguments`] itself.
pub(crate) fn invalid_from_box(tool: &str, error: BoxError) -> ToolError {
    let error = match error.downcast::<serde_path_to_error::Error<serde_json::Error>>() {
        Ok(e) => return invalid_from_path_error(tool, &e),
        Err(other) => other,
    };
    match error.downcast::<ToolError>() {
        Ok(e) => match *e {
            ToolError::InvalidArguments { path, message, .. } => {
                ToolError::invalid_arguments(tool, path, message)
            }
            other => ToolError::invalid_arguments(tool, ".", other.to_string()),
        },
        Err(other) => ToolError::invalid_arguments(tool, ".", other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn custom_decoder_errors_map_to_invalid_arguments() {
        let plain = invalid_from_box("t", "nope".into());
        assert!(
            matches!(&plain, ToolError::InvalidArguments { tool, path, message } if tool == "t" && path == "." && message == "nope")
        );
        let own = invalid_from_box(
            "t",
            Box::new(ToolError::invalid_arguments("other", "a[0]", "bad")),
        );
        assert!(
            matches!(&own, ToolError::InvalidArguments { tool, path, message } if tool == "t" && path == "a[0]" && message == "bad")
        );
        let other = invalid_from_box("t", Box::new(ToolError::model("m")));
        assert!(
            matches!(&other, ToolError::InvalidArguments { path, message, .. } if path == "." && message == "chat model failed: m")
        );
    }

    #[test]
    fn trailing_characters_are_an_error_at_the_root() {
        let err = decode_json::<Vec<u8>>("[1] [2]").unwrap_err();
        assert_eq!(err.path().to_string(), ".");
        assert!(err.inner().to_string().contains("trailing characters"));
    }
}
