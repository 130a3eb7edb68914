// Keeps a release build on Windows from opening a console next to the window.
#![cfg_attr(not(debug_assertions), windows_subsystem = "windows")]

#[global_allocator]
static GLOBAL: ostinato_engine::runtime::Allocator = ostinato_engine::runtime::ALLOCATOR;

fn main() {
    ostinato_engine::runtime::configure();
    ostinato_app::run();
}
