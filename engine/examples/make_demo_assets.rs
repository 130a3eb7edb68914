//! Regenerates the demo dataset: `cargo run -p ostinato-engine --example make_demo_assets [DIR]`
//! (DIR defaults to assets/demo).

fn main() -> std::io::Result<()> {
    let dir =
        std::env::args_os().nth(1).map(std::path::PathBuf::from).unwrap_or_else(ostinato_engine::data::synth::demo_dir);
    for wav in ostinato_engine::data::synth::write_demo(&dir)? {
        println!("{}", wav.display());
    }
    Ok(())
}
