//! The committed header is what cbindgen makes of the crate now: a change to the C
//! interface that did not regenerate `include/rdmactor.h` fails here (CI runs it with
//! the crate's tests). `RDMACTOR_BLESS=1` writes the new header instead.

use std::path::Path;

#[test]
fn the_committed_header_is_current() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config =
        cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen understands the crate")
        .write(&mut generated);
    let path = crate_dir.join("include/rdmactor.h");
    if std::env::var_os("RDMACTOR_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("writing the header");
        return;
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is not what cbindgen generates from the crate now: run \
         `RDMACTOR_BLESS=1 cargo test -p rdmactor-c --test header` and commit the result",
        path.display()
    );
}
