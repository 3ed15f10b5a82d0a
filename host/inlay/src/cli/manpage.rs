//! The man pages of the Debian package, written from the clap definitions
//! of [`super`] so that they never disagree with `inlay --help`.

use std::path::{Path, PathBuf};

use clap::CommandFactory as _;

use super::Cli;

/// Write `inlay.1` and one page per visible subcommand (`inlay-serve.1`,
/// `inlay-check.1`, ...) into `dir`, which must exist. Returns the files
/// written, `inlay.1` last.
pub fn write_manpages(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let mut cmd = Cli::command().disable_help_subcommand(true);
    // Subcommands get their display names ("inlay-serve") when built.
    cmd.build();
    write_tree(cmd, dir, &mut written)?;
    Ok(written)
}

fn write_tree(cmd: clap::Command, dir: &Path, written: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_tree(sub.clone(), dir, written)?;
    }
    let is_main = cmd.get_display_name().is_none();
    // No date: the same sources give byte-identical pages (reproducible .deb).
    let page = clap_mangen::Man::new(cmd).manual("Inlay Manual");
    if !is_main {
        written.push(page.generate_to(dir)?);
        return Ok(());
    }
    let path = dir.join(page.get_filename());
    let mut out = Vec::new();
    page.render_title(&mut out)?;
    page.render_name_section(&mut out)?;
    page.render_synopsis_section(&mut out)?;
    page.render_description_section(&mut out)?;
    page.render_options_section(&mut out)?;
    page.render_subcommands_section(&mut out)?;
    out.extend_from_slice(MAIN_PAGE_SECTIONS.as_bytes());
    page.render_version_section(&mut out)?;
    std::fs::write(&path, out)?;
    written.push(path);
    Ok(())
}

/// What the clap definitions do not say: signals, the package's files and
/// where the rest is documented (roff).
const MAIN_PAGE_SECTIONS: &str = r#".SH SIGNALS
.TP
\fBSIGTERM\fR, \fBSIGINT\fR
Stop accepting, let in\-flight requests finish (up to \fBserver.shutdown_timeout\fR), flush the cache and exit 0.
.TP
\fBSIGHUP\fR
Read the configuration file again and apply it, policy included, as a new generation: requests in flight finish on the old one; a file with errors changes nothing and every error is logged. Listen addresses need a restart; cache sizes apply in place; a new cache directory serves new requests from a store opened there (\fBsystemctl reload inlay\fR sends it).
.SH FILES
.TP
\fI/etc/inlay/inlay.toml\fR
The configuration the Debian package's \fBinlay.service\fR serves with; \fBinlay check \-\-config\fR validates it.
.TP
\fI/var/lib/inlay/cache\fR
The persistent cache tier of the packaged configuration (the unit's StateDirectory).
.TP
\fI/usr/share/doc/inlay/CONFIG.md\fR
Every configuration key and its default.
.TP
\fI/usr/share/doc/inlay/docs/\fR
One page per topic (reload, metrics, admin API, bans, cluster...); \fIREADME.md\fR maps them.
.SH ENVIRONMENT
.TP
\fBINLAY_LOG\fR
Diagnostic log filter (stderr), e.g. \fBinlay=debug\fR; overrides \fBlog.level\fR.
.SH "SEE ALSO"
\fBsystemctl\fR(1), \fBjournalctl\fR(1), \fI/usr/share/doc/inlay/README.md\fR
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_visible_subcommand_gets_a_page_and_the_main_page_lists_them() {
        let dir = tempfile::tempdir().unwrap();
        let files = write_manpages(dir.path()).unwrap();
        let names: Vec<_> = files
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        for want in ["inlay.1", "inlay-serve.1", "inlay-check.1"] {
            assert!(names.iter().any(|n| n == want), "{want} not in {names:?}");
        }
        // The generator itself is no user command.
        assert!(!names.iter().any(|n| n.contains("manpages")), "{names:?}");
        let main = std::fs::read_to_string(dir.path().join("inlay.1")).unwrap();
        assert!(main.contains(".TH inlay 1"), "{main}");
        assert!(
            main.contains("serve") && !main.contains("manpages"),
            "{main}"
        );
        for section in [".SH SIGNALS", ".SH FILES", "/etc/inlay/inlay.toml"] {
            assert!(main.contains(section), "{section} missing: {main}");
        }
        let serve = std::fs::read_to_string(dir.path().join("inlay-serve.1")).unwrap();
        assert!(serve.contains("\\-\\-cache\\-dir"), "{serve}");
    }
}
