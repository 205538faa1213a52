# sw-pool — see README.md. Every target runs as root on Debian 12 with nothing installed by hand.
SHELL := /bin/bash
PREFIX ?= /usr/local
CARGO ?= cargo
BIN := target/release/sw-pool
# the front (`sw-pool`: run/shell, and the exec of sw-pool-full for the rest) ships linked
# statically (glibc, crt-static; it does no NSS lookup: docs/architecture.md), built for the host
# triple so that the flag reaches this binary only (not build scripts, not the other programs);
# `=`, not `:=`: read when a recipe needs it, after `setup` has made sure rustc is there
HOST = $(shell rustc -vV | sed -n 's/^host: //p')
FRONT = target/$(HOST)/release/sw-pool

.PHONY: all setup build spank install uninstall test test-unit test-cluster test-deb deb lint demo bench bench-build fuzz clean model model-1024 test-model

all: build

setup:
	bash tools/setup-deps.sh

build: setup
	$(CARGO) build --release --workspace
	RUSTFLAGS="-C target-feature=+crt-static" $(CARGO) build --release -p sw-pool --bin sw-pool --target $(HOST)
	$(MAKE) --no-print-directory spank

# the Slurm SPANK plugin (`--pool` for sbatch/salloc/srun), against Debian's Slurm headers
SPANK := target/release/sw_pool_spank.so
spank: $(SPANK)
$(SPANK): slurm/sw_pool_spank.c
	mkdir -p $(dir $@)
	$(CC) -std=gnu11 -O2 -Wall -Wextra -Werror -fPIC -shared -o $@ $<

install: build
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/man/man1 \
	  $(DESTDIR)$(PREFIX)/share/bash-completion/completions \
	  $(DESTDIR)$(PREFIX)/share/zsh/site-functions $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d
	install -m 0755 $(FRONT) $(DESTDIR)$(PREFIX)/bin/sw-pool
	install -m 0755 $(BIN)-full $(BIN)-enter $(BIN)-serve $(BIN)-view $(DESTDIR)$(PREFIX)/bin/
	ln -sf sw-pool $(DESTDIR)$(PREFIX)/bin/scalable-fs-cp
	ln -sf sw-pool $(DESTDIR)$(PREFIX)/bin/scalable-fs-mount
	install -d $(DESTDIR)$(PREFIX)/libexec/sw-pool
	for h in prolog task-prolog epilog; do ln -sf ../../bin/sw-pool $(DESTDIR)$(PREFIX)/libexec/sw-pool/$$h; done
	install -m 0755 target/release/sw-pool-mount-helper $(DESTDIR)$(PREFIX)/libexec/sw-pool/sw-pool-mount-helper
	install -d $(DESTDIR)$(PREFIX)/share/sw-pool
	install -m 0644 etc/sw-pool/helper.toml.example $(DESTDIR)$(PREFIX)/share/sw-pool/helper.toml.example
	$(BIN) generate man $(DESTDIR)$(PREFIX)/share/man/man1
	$(BIN) generate completions bash > $(DESTDIR)$(PREFIX)/share/bash-completion/completions/sw-pool
	$(BIN) generate completions zsh > $(DESTDIR)$(PREFIX)/share/zsh/site-functions/_sw-pool
	$(BIN) generate completions fish > $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d/sw-pool.fish
	install -d $(DESTDIR)/etc/profile.d $(DESTDIR)$(PREFIX)/share/sw-pool/lmod
	install -m 0644 etc/profile.d/sw-pool.sh $(DESTDIR)/etc/profile.d/sw-pool.sh
	install -m 0644 etc/lmod/pool-modulefile.lua $(DESTDIR)$(PREFIX)/share/sw-pool/lmod/pool-modulefile.lua
	install -d $(DESTDIR)$(PREFIX)/share/sw-pool/modules
	install -m 0644 etc/modules/pool-modulefile.tcl $(DESTDIR)$(PREFIX)/share/sw-pool/modules/pool-modulefile.tcl
	install -d $(DESTDIR)$(PREFIX)/lib/sw-pool
	install -m 0755 $(SPANK) $(DESTDIR)$(PREFIX)/lib/sw-pool/sw_pool_spank.so

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/sw-pool $(DESTDIR)$(PREFIX)/bin/sw-pool-full $(DESTDIR)$(PREFIX)/bin/sw-pool-enter $(DESTDIR)$(PREFIX)/bin/sw-pool-serve $(DESTDIR)$(PREFIX)/bin/sw-pool-view \
	  $(DESTDIR)$(PREFIX)/bin/scalable-fs-cp $(DESTDIR)$(PREFIX)/bin/scalable-fs-mount \
	  $(DESTDIR)$(PREFIX)/share/man/man1/sw-pool*.1 \
	  $(DESTDIR)$(PREFIX)/share/bash-completion/completions/sw-pool \
	  $(DESTDIR)$(PREFIX)/share/zsh/site-functions/_sw-pool \
	  $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d/sw-pool.fish \
	  $(DESTDIR)/etc/profile.d/sw-pool.sh $(DESTDIR)$(PREFIX)/share/sw-pool/lmod/pool-modulefile.lua \
	  $(DESTDIR)$(PREFIX)/share/sw-pool/modules/pool-modulefile.tcl \
	  $(DESTDIR)$(PREFIX)/lib/sw-pool/sw_pool_spank.so \
	  $(DESTDIR)$(PREFIX)/libexec/sw-pool/prolog $(DESTDIR)$(PREFIX)/libexec/sw-pool/task-prolog \
	  $(DESTDIR)$(PREFIX)/libexec/sw-pool/epilog $(DESTDIR)$(PREFIX)/libexec/sw-pool/sw-pool-mount-helper \
	  $(DESTDIR)$(PREFIX)/share/sw-pool/helper.toml.example

# advisories are not checked: that clones the RustSec database from GitHub (see deny.toml)
lint: setup
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --release -- -D warnings
	bash tools/lint-shell.sh
	python3 tools/lint-structure.py
	bash tools/check-link-graph.sh
	$(CARGO) check --manifest-path fuzz/Cargo.toml --release --quiet  # the fuzz targets keep building with the parsers they link
	$(CARGO) deny check licenses bans sources

# a test that cannot run here prints "SKIP <test>: <reason>" (uncaptured); they are counted here
test-unit: build
	set -o pipefail; $(CARGO) test --workspace --release 2>&1 | tee target/test-unit.log
	@n=$$(grep -cE 'SKIP [A-Za-z0-9_:()]+: ' target/test-unit.log || true); echo "unit tests: $$n skipped"; \
	  grep -oE 'SKIP [A-Za-z0-9_:()]+: .*' target/test-unit.log || true
	python3 bench/test_labels.py
	$(MAKE) test-model

# the virtual cluster suite: brings the testbed up, runs tests/cluster, always tears it down;
# BUSY=1: under a background load (one niced busy loop per core, tests/cluster/run --busy)
test-cluster: build
	bash tools/run-cluster-tests.sh $(if $(BUSY),--busy)

test: lint test-unit test-deb test-cluster

# the Debian package: target/debian/sw-pool_<version>_<arch>.deb (the files of `make install`)
deb: build
	bash tools/make-deb.sh

# builds the package, installs it with dpkg, runs the admin steps with it, purges it
test-deb: build
	bash tests/deb/run.sh

# a newcomer's first command: only what the demo needs is installed (tools/setup-deps.sh demo)
demo:
	bash tools/setup-deps.sh demo
	$(CARGO) build --release --workspace
	$(MAKE) --no-print-directory spank
	bash tools/demo.sh

# the benchmark report: brings the virtual cluster up with the benchmark caps, runs every
# configuration, writes bench/results/<date>/report.md with plots, takes the cluster down (~2 h at the
# default sizes on 2 cores; sizes: see the header of bench/run)
bench: build
	bash bench/run

bench-build: build
	bash bench/build-overhead.sh

# coverage-guided fuzzing of the parsers of untrusted bytes (manifest, pool trailer, signature block,
# superblock size, layer list, squashfs reader); FUZZ_SECONDS per target (default 600).
# cargo-fuzz on the nightly toolchain (AddressSanitizer) where rustup has nightly (cargo-fuzz is then
# installed from crates.io if missing), otherwise a stable build of the same libFuzzer targets, no
# sanitizer (header of fuzz/run-all.sh; the last results: fuzz/RESULTS.md).
FUZZ_SECONDS ?= 600
fuzz: setup
	if rustup toolchain list 2>/dev/null | grep -q '^nightly' && ! command -v cargo-fuzz >/dev/null; then \
	  $(CARGO) install --locked cargo-fuzz || echo "fuzz: cargo-fuzz did not install: the stable build runs"; fi
	bash fuzz/run-all.sh $(FUZZ_SECONDS)

clean:
	$(CARGO) clean

# the SimGrid scale model of the broadcast (model/README.md): calibration against the bench
# results and the paper, predictions to 1,024 nodes, report + plots in bench/results/model-*.md
# (< 10 min on 2 cores; MODEL_JOBS simulations at once, default 2)
PYTHON3 ?= /usr/bin/python3
model:
	cd model && $(PYTHON3) -m swpmodel.run

# the engine's ring simulated at 1,024 nodes, 1 GB, three platforms (~40 min; model/README.md)
model-1024:
	cd model && $(PYTHON3) -m swpmodel.run --at-1024

# fast check that the model runs and stays calibrated (part of test-unit)
test-model:
	$(PYTHON3) model/test_model.py
