//! What every tool kind implements ([`Tool`]), what it answers ([`ToolOutput`]), and the
//! argument checks the kinds share.

use std::sync::Arc;

use image::RgbImage;
use serde_json::{Map, Value as Json};

/// What a tool answers: text, and pictures the model then sees.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    pub text: String,
    pub pictures: Vec<RgbImage>,
}

/// A tool kind's behaviour.
pub trait Tool: Send + Sync {
    /// The tool's OpenAI function description, under `name` (what a system prompt or a chat
    /// template's `tools` lists).
    fn function(&self, name: &str) -> Json;
    /// Runs one call with its arguments; `pictures` are the conversation's pictures so far (the
    /// prompt's, then earlier tool answers'). `Err` is the message the model gets.
    fn call(
        &self,
        arguments: &Map<String, Json>,
        pictures: &[Arc<RgbImage>],
    ) -> Result<ToolOutput, String>;
}

/// The picture a call's `image` argument names (default 0), with its index, or the message.
pub(crate) fn picture_argument<'a>(
    arguments: &Map<String, Json>,
    pictures: &'a [Arc<RgbImage>],
) -> Result<(usize, &'a Arc<RgbImage>), String> {
    let k = match arguments.get("image") {
        None | Some(Json::Null) => 0,
        Some(v) => v
            .as_u64()
            .ok_or_else(|| format!("Error: image must be an image index (0, 1, ...), got {v}"))?
            as usize,
    };
    match pictures.get(k) {
        Some(p) => Ok((k, p)),
        None if pictures.is_empty() => Err("Error: the conversation holds no image".into()),
        None => Err(format!(
            "Error: there is no image {k}; the conversation holds {} (0 to {})",
            pictures.len(),
            pictures.len() - 1
        )),
    }
}

/// The message for an argument a tool does not take.
pub(crate) fn known_arguments(arguments: &Map<String, Json>, known: &[&str]) -> Result<(), String> {
    match arguments.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(format!(
            "Error: unknown argument `{k}`; the arguments are {}",
            known.join(", ")
        )),
        None => Ok(()),
    }
}
