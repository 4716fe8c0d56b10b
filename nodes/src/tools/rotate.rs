//! `rotate`: one of the conversation's pictures turned by a multiple of 90° counter-clockwise
//! (Pillow's `Image.rotate` direction), returned as a new picture.
//!
//! Arguments: `angle` (degrees: 90, 180, 270 or −90), `image` as for `crop` (default 0).

use std::sync::Arc;

use image::RgbImage;
use serde::Deserialize;
use serde_json::{Map, Value as Json, json};

use super::tool::{Tool, ToolOutput, known_arguments, picture_argument};

/// `rotate` takes no parameters in the graph.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RotateParams {}

/// The tool.
#[derive(Debug, Clone)]
pub struct Rotate;

impl Tool for Rotate {
    fn function(&self, name: &str) -> Json {
        json!({
            "type": "function",
            "function": {
                "name": name,
                "description": "Rotate an image counter-clockwise by 90, 180 or 270 degrees.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "angle": {"type": "integer", "enum": [90, 180, 270, -90]},
                        "image": {"type": "integer", "description": "which image, counting from 0 (default 0)"}
                    },
                    "required": ["angle"]
                }
            }
        })
    }

    fn call(
        &self,
        arguments: &Map<String, Json>,
        pictures: &[Arc<RgbImage>],
    ) -> Result<ToolOutput, String> {
        known_arguments(arguments, &["angle", "image"])?;
        let (k, picture) = picture_argument(arguments, pictures)?;
        let angle = arguments
            .get("angle")
            .ok_or("Error: missing argument angle")?;
        let degrees = angle
            .as_f64()
            .filter(|a| a.fract() == 0.0)
            .map(|a| (a as i64).rem_euclid(360))
            .filter(|a| a % 90 == 0 && *a != 0)
            .ok_or_else(|| format!("Error: angle must be 90, 180, 270 or -90, got {angle}"))?;
        // image's rotations turn clockwise.
        let turned = match degrees {
            90 => image::imageops::rotate270(picture.as_ref()),
            180 => image::imageops::rotate180(picture.as_ref()),
            _ => image::imageops::rotate90(picture.as_ref()),
        };
        Ok(ToolOutput {
            text: format!("Image {k} rotated by {degrees} degrees counter-clockwise."),
            pictures: vec![turned],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quarter_turns_counter_clockwise() {
        let p = Arc::new(RgbImage::from_fn(3, 2, |x, y| {
            image::Rgb([x as u8, y as u8, 0])
        }));
        let call = |a: Json| {
            Rotate.call(
                json!({"angle": a}).as_object().unwrap(),
                std::slice::from_ref(&p),
            )
        };
        let q = &call(json!(90)).unwrap().pictures[0];
        assert_eq!(q.dimensions(), (2, 3));
        // Counter-clockwise: the top-right pixel goes to the top-left.
        assert_eq!(q.get_pixel(0, 0).0, [2, 0, 0]);
        assert_eq!(
            &call(json!(-90)).unwrap().pictures[0],
            &image::imageops::rotate90(p.as_ref())
        );
        assert!(call(json!(45)).unwrap_err().contains("90, 180, 270"));
        assert!(call(json!("left")).unwrap_err().contains("90, 180, 270"));
    }
}
