//! plan.json: the Plan IR as JSON, with the do-not-edit header as `$comment`.

use featshard_spec::plan::Plan;

use crate::{header_lines, CodegenError};

/// `<module>.plan.json`: the plan as JSON, with the generated-file header.
pub fn plan_json(plan: &Plan) -> Result<String, CodegenError> {
    let mut value = serde_json::to_value(plan).map_err(|e| CodegenError(e.to_string()))?;
    if let Some(obj) = value.as_object_mut() {
        obj.insert(
            "$comment".to_owned(),
            serde_json::Value::String(header_lines(plan).join(" ")),
        );
    }
    let mut text = serde_json::to_string_pretty(&value).map_err(|e| CodegenError(e.to_string()))?;
    text.push('\n');
    Ok(text)
}
