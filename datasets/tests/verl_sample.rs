//! The sample files written by verl's geo3k preprocessing load exactly as `expected.json` says
//! (every row, discovered from expected.json): values, placeholders, image sizes, modes, bytes
//! and RGB pixel hashes.

use std::path::PathBuf;

use flowrl_datasets::images::{EncodedFormat, decode_rgb};
use flowrl_datasets::verl::{ReadOptions, read_verl_file, summarize_file};
use serde_json::Value;
use sha2::{Digest, Sha256};

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/data/verl_geo3k_sample")
}

fn hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn pil_mode(bytes: &[u8]) -> &'static str {
    match image::load_from_memory(bytes).unwrap().color() {
        image::ColorType::L8 | image::ColorType::L16 => "L",
        image::ColorType::La8 | image::ColorType::La16 => "LA",
        image::ColorType::Rgba8 | image::ColorType::Rgba16 => "RGBA",
        _ => "RGB",
    }
}

#[test]
fn every_row_matches_expected_json() {
    let dir = fixture_dir();
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let splits = expected["splits"].as_object().unwrap();
    assert!(!splits.is_empty());
    let mut checked_rows = 0;
    let mut checked_images = 0;
    for (split, want) in splits {
        let path = dir.join(want["file"].as_str().unwrap());
        let summary = summarize_file(&path).unwrap();
        assert_eq!(
            summary.num_rows as u64,
            want["num_rows"].as_u64().unwrap(),
            "{split}"
        );
        assert_eq!(
            summary.num_row_groups as u64,
            want["num_row_groups"].as_u64().unwrap()
        );
        let names: Vec<&str> = summary.columns.iter().map(|c| c.0.as_str()).collect();
        let want_names: Vec<&str> = want["columns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap())
            .collect();
        assert_eq!(names, want_names);

        let file = read_verl_file(&path, &ReadOptions::default()).unwrap();
        assert!(file.skipped.is_empty());
        let rows = want["rows"].as_array().unwrap();
        assert_eq!(file.rows.len(), rows.len());
        for w in rows {
            let r = w["row"].as_u64().unwrap() as usize;
            let got = &file.rows[r];
            let ctx = format!("{split} row {r}");
            assert_eq!(got.source.row, r, "{ctx}");
            assert_eq!(got.data_source, w["data_source"].as_str().unwrap(), "{ctx}");
            assert_eq!(got.ability.as_deref(), w["ability"].as_str(), "{ctx}");
            assert_eq!(
                serde_json::to_value(&got.messages).unwrap(),
                w["prompt"],
                "{ctx}"
            );
            assert_eq!(
                got.ground_truth,
                w["reward_model"]["ground_truth"].as_str().unwrap(),
                "{ctx}"
            );
            assert_eq!(got.extra_info, w["extra_info"], "{ctx}");
            assert_eq!(
                got.num_placeholders() as u64,
                w["num_placeholders"].as_u64().unwrap(),
                "{ctx}"
            );
            let want_images = w["images"].as_array().unwrap();
            assert_eq!(got.images.len(), want_images.len(), "{ctx}");
            for (k, (img, wi)) in got.images.iter().zip(want_images).enumerate() {
                let ctx = format!("{ctx} image {k}");
                assert_eq!(
                    EncodedFormat::sniff(&img.bytes).unwrap().name(),
                    wi["format"].as_str().unwrap(),
                    "{ctx}"
                );
                assert_eq!(img.bytes.len() as u64, wi["num_bytes"].as_u64().unwrap());
                assert_eq!(
                    hex(&img.bytes),
                    wi["bytes_sha256"].as_str().unwrap(),
                    "{ctx}"
                );
                assert_eq!(img.path.as_deref(), wi["path"].as_str(), "{ctx}");
                assert_eq!(pil_mode(&img.bytes), wi["mode"].as_str().unwrap(), "{ctx}");
                let rgb = decode_rgb(&img.bytes).unwrap();
                assert_eq!(rgb.width() as u64, wi["width"].as_u64().unwrap(), "{ctx}");
                assert_eq!(rgb.height() as u64, wi["height"].as_u64().unwrap(), "{ctx}");
                if let Some(h) = wi["rgb8_sha256"].as_str() {
                    assert_eq!(hex(rgb.as_raw()), h, "{ctx}");
                }
                let n = (rgb.width() * rgb.height()) as f64;
                for c in 0..3 {
                    let mean = rgb.pixels().map(|p| p.0[c] as f64).sum::<f64>() / n;
                    let want_mean = wi["mean_rgb"][c].as_f64().unwrap();
                    let tol = if wi["format"] == "JPEG" { 1.0 } else { 1e-3 };
                    assert!((mean - want_mean).abs() <= tol, "{ctx} channel {c}: {mean}");
                }
                checked_images += 1;
            }
            checked_rows += 1;
        }
    }
    let total: u64 = splits
        .values()
        .map(|s| s["num_rows"].as_u64().unwrap())
        .sum();
    assert_eq!(checked_rows, total);
    assert!(
        checked_rows > 0 && checked_images >= checked_rows,
        "{checked_images}"
    );
}
