//! `crop` and `zoom_in`: a region of one of the conversation's pictures, returned as a new
//! picture (DeepEyes' and verl's `image_zoom_in_tool`).
//!
//! Arguments: `bbox_2d` = `[x1, y1, x2, y2]` (left, top, right, bottom) in the tool's
//! `coordinates`: `pixel` (of the picture as the conversation holds it), `norm1000` (0–1000 of
//! each side, Qwen3-VL's grounding convention) or `norm1` (0–1); `image` = which picture,
//! counting the prompt's then earlier tool answers' from 0 (default 0); `label` (DeepEyes'
//! schema: what the region shows) is accepted and not used. The box must lie inside
//! the picture with `x1 < x2`, `y1 < y2`; a box narrower than `min_size` pixels is widened about
//! its centre to `min_size` (kept inside the picture), as verl's tool does so the processor gets
//! at least one merged patch. The region `[floor x1, ceil x2) × [floor y1, ceil y2)` is cut out
//! and resized by `scale` (bicubic; `zoom_in` defaults to 2, `crop` to 1).

use std::sync::Arc;

use image::RgbImage;
use image::imageops::FilterType;
use serde::Deserialize;
use serde_json::{Map, Value as Json, json};

use super::tool::{Tool, ToolOutput, known_arguments, picture_argument};

/// How a box's numbers are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Coordinates {
    Pixel,
    Norm1000,
    Norm1,
}

/// Parameters of a `crop` / `zoom_in` tool in the graph.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CropParams {
    #[serde(default = "pixel")]
    pub coordinates: Coordinates,
    /// Smallest side of a cut-out region, in pixels.
    #[serde(default = "min_size")]
    pub min_size: u32,
    /// Resize factor of the cut-out region.
    pub scale: Option<f64>,
}

fn pixel() -> Coordinates {
    Coordinates::Pixel
}

fn min_size() -> u32 {
    28
}

/// The tool.
#[derive(Debug, Clone)]
pub struct Crop {
    pub params: CropParams,
    /// `scale` when the graph does not set it.
    pub default_scale: f64,
}

impl Crop {
    /// Checks the parameters (a message for the graph's diagnostics).
    pub fn new(params: CropParams, default_scale: f64) -> Result<Self, String> {
        if let Some(s) = params.scale
            && !(s.is_finite() && s > 0.0 && s <= 16.0)
        {
            return Err(format!("`scale` must be in (0, 16], got {s}"));
        }
        if params.min_size == 0 {
            return Err("`min_size` must be at least 1".into());
        }
        Ok(Self {
            params,
            default_scale,
        })
    }

    fn scale(&self) -> f64 {
        self.params.scale.unwrap_or(self.default_scale)
    }

    /// The pixel box `[left, top, right, bottom)` a call's `bbox_2d` names in a `w × h`
    /// picture, or the message the model gets.
    pub fn pixel_box(&self, bbox: &Json, w: u32, h: u32) -> Result<[u32; 4], String> {
        let numbers: Option<Vec<f64>> = bbox
            .as_array()
            .filter(|a| a.len() == 4)
            .map(|a| a.iter().filter_map(Json::as_f64).collect())
            .filter(|v: &Vec<f64>| v.len() == 4 && v.iter().all(|x| x.is_finite()));
        let Some(v) = numbers else {
            return Err(format!(
                "Error: bbox_2d must be a list of 4 numbers [x1, y1, x2, y2], got {bbox}"
            ));
        };
        let (fx, fy, range) = match self.params.coordinates {
            Coordinates::Pixel => (1.0, 1.0, format!("0..{w} × 0..{h} pixels")),
            Coordinates::Norm1000 => (w as f64 / 1000.0, h as f64 / 1000.0, "0..1000".into()),
            Coordinates::Norm1 => (w as f64, h as f64, "0..1".into()),
        };
        let [x1, y1, x2, y2] = [v[0] * fx, v[1] * fy, v[2] * fx, v[3] * fy];
        let eps = 1e-9;
        if x1 < -eps || y1 < -eps || x2 > w as f64 + eps || y2 > h as f64 + eps {
            return Err(format!(
                "Error: bbox_2d {bbox} is outside the image ({range}; the image is {w}×{h})"
            ));
        }
        if !(x1 < x2 && y1 < y2) {
            return Err(format!(
                "Error: bbox_2d {bbox} must have x1 < x2 and y1 < y2"
            ));
        }
        let min = self.params.min_size as f64;
        if (w as f64) < min || (h as f64) < min {
            return Err(format!(
                "Error: the image is {w}×{h}, smaller than the {min}-pixel regions this tool cuts"
            ));
        }
        let widen = |lo: f64, hi: f64, size: f64| -> (f64, f64) {
            if hi - lo >= min {
                return (lo, hi);
            }
            let lo = ((lo + hi) / 2.0 - min / 2.0).clamp(0.0, size - min);
            (lo, lo + min)
        };
        let (x1, x2) = widen(x1.max(0.0), x2.min(w as f64), w as f64);
        let (y1, y2) = widen(y1.max(0.0), y2.min(h as f64), h as f64);
        Ok([
            x1.floor() as u32,
            y1.floor() as u32,
            (x2.ceil() as u32).min(w),
            (y2.ceil() as u32).min(h),
        ])
    }
}

impl Tool for Crop {
    fn function(&self, name: &str) -> Json {
        let unit = match self.params.coordinates {
            Coordinates::Pixel => "pixels",
            Coordinates::Norm1000 => "thousandths of the image's width and height (0-1000)",
            Coordinates::Norm1 => "fractions of the image's width and height (0-1)",
        };
        json!({
            "type": "function",
            "function": {
                "name": name,
                "description": format!("Cut out a region of an image and look at it more closely. The box is in {unit}."),
                "parameters": {
                    "type": "object",
                    "properties": {
                        "bbox_2d": {"type": "array", "items": {"type": "number"}, "minItems": 4, "maxItems": 4,
                                    "description": "[x1, y1, x2, y2]: left, top, right, bottom"},
                        "image": {"type": "integer", "description": "which image, counting from 0 (default 0)"},
                        "label": {"type": "string", "description": "what the region shows"}
                    },
                    "required": ["bbox_2d"]
                }
            }
        })
    }

    fn call(
        &self,
        arguments: &Map<String, Json>,
        pictures: &[Arc<RgbImage>],
    ) -> Result<ToolOutput, String> {
        known_arguments(arguments, &["bbox_2d", "image", "label"])?;
        let (k, picture) = picture_argument(arguments, pictures)?;
        let bbox = arguments
            .get("bbox_2d")
            .ok_or("Error: missing argument bbox_2d")?;
        let [l, t, r, b] = self.pixel_box(bbox, picture.width(), picture.height())?;
        let region = image::imageops::crop_imm(picture.as_ref(), l, t, r - l, b - t).to_image();
        let scale = self.scale();
        let region = if (scale - 1.0).abs() > 1e-12 {
            let w = ((region.width() as f64 * scale).round() as u32).max(1);
            let h = ((region.height() as f64 * scale).round() as u32).max(1);
            image::imageops::resize(&region, w, h, FilterType::CatmullRom)
        } else {
            region
        };
        Ok(ToolOutput {
            text: format!(
                "Region [{l}, {t}, {r}, {b}] of image {k} ({}×{} pixels).",
                region.width(),
                region.height()
            ),
            pictures: vec![region],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(coordinates: Coordinates, scale: Option<f64>) -> Crop {
        Crop::new(
            CropParams {
                coordinates,
                min_size: 28,
                scale,
            },
            1.0,
        )
        .unwrap()
    }

    fn picture(w: u32, h: u32) -> Arc<RgbImage> {
        Arc::new(RgbImage::from_fn(w, h, |x, y| {
            image::Rgb([x as u8, y as u8, (x + y) as u8])
        }))
    }

    fn args(v: Json) -> Map<String, Json> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn crops_the_pixel_box_exactly() {
        let out = tool(Coordinates::Pixel, None)
            .call(
                &args(json!({"bbox_2d": [10, 20, 50, 60]})),
                &[picture(112, 84)],
            )
            .unwrap();
        let p = &out.pictures[0];
        assert_eq!(p.dimensions(), (40, 40));
        assert_eq!(p.get_pixel(0, 0).0, [10, 20, 30]);
        assert_eq!(p.get_pixel(39, 39).0, [49, 59, 108]);
        assert!(out.text.contains("[10, 20, 50, 60]"), "{}", out.text);
    }

    #[test]
    fn normalised_boxes_small_boxes_and_scaling() {
        let t = tool(Coordinates::Norm1000, None);
        assert_eq!(
            t.pixel_box(&json!([0, 0, 500, 500]), 112, 84).unwrap(),
            [0, 0, 56, 42]
        );
        let t = tool(Coordinates::Norm1, None);
        assert_eq!(
            t.pixel_box(&json!([0.5, 0.5, 1.0, 1.0]), 112, 84).unwrap(),
            [56, 42, 112, 84]
        );
        // A 4×4 box widens to 28×28 about its centre, kept inside the picture.
        let t = tool(Coordinates::Pixel, None);
        assert_eq!(
            t.pixel_box(&json!([100, 0, 104, 4]), 112, 84).unwrap(),
            [84, 0, 112, 28]
        );
        let out = tool(Coordinates::Pixel, Some(2.0))
            .call(
                &args(json!({"bbox_2d": [0, 0, 30, 28]})),
                &[picture(112, 84)],
            )
            .unwrap();
        assert_eq!(out.pictures[0].dimensions(), (60, 56));
    }

    #[test]
    fn bad_calls_are_messages_for_the_model() {
        let t = tool(Coordinates::Pixel, None);
        let p = [picture(112, 84)];
        let err = |v: Json| t.call(&args(v), &p).unwrap_err();
        assert!(err(json!({"bbox_2d": [0, 0, 500, 10]})).contains("outside the image"));
        assert!(err(json!({"bbox_2d": [50, 0, 10, 30]})).contains("x1 < x2"));
        assert!(err(json!({"bbox_2d": [0, 0, 30]})).contains("4 numbers"));
        assert!(err(json!({"bbox_2d": "all"})).contains("4 numbers"));
        assert!(err(json!({})).contains("missing argument bbox_2d"));
        assert!(err(json!({"bbox_2d": [0, 0, 30, 30], "image": 3})).contains("no image 3"));
        assert!(
            err(json!({"bbox_2d": [0, 0, 30, 30], "zoom": 2}))
                .contains("unknown argument `zoom`; the arguments are bbox_2d, image, label")
        );
        assert!(
            t.call(
                &args(json!({"bbox_2d": [0, 0, 10, 10]})),
                &[picture(20, 20)]
            )
            .unwrap_err()
            .contains("smaller than")
        );
    }
}
