# idemflow — top-level build.  GNU make; no generator needed.
#
#   make                       install missing packages, build the library, programs and
#                              tests (warnings are errors); `make all` only builds
#   make run                   run the engine on embedded SQLite with the example workflow
#   make test                  install missing packages, build, run every test (both stores)
#   make test SANITIZER=address,undefined   the same under ASan+UBSan (clang)
#   make test SANITIZER=thread               the concurrent tests under TSan
#   make bench                 run the benchmarks in bench/ (prints figures)
#   make fuzz                  build libFuzzer targets (clang) into build-fuzz/
#   make format                clang-format every source file in place

SANITIZER ?=
comma := ,
ifeq ($(SANITIZER),)
  BUILD ?= build
  CC ?= cc
  OPT ?= -O2
else
  BUILD ?= build-$(subst $(comma),-,$(SANITIZER))
  CC := clang
  OPT ?= -O1
  SANFLAGS := -fsanitize=$(SANITIZER) -fno-omit-frame-pointer -fno-sanitize-recover=all
endif

PKGS := libmicrohttpd libcurl sqlite3 libpq jansson libcrypto libssl zlib
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS := $(shell pkg-config --libs $(PKGS) 2>/dev/null)

WARN := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wformat=2 \
        -Wno-unused-parameter -Werror
CFLAGS := -std=c11 -D_GNU_SOURCE $(OPT) -g $(WARN) -Isrc $(PKG_CFLAGS) $(SANFLAGS) $(EXTRA_CFLAGS)
LDFLAGS := $(SANFLAGS) $(EXTRA_LDFLAGS)
LDLIBS := $(PKG_LIBS) -lpthread -lm
# The engine's allocator.  tcmalloc (Debian's libtcmalloc-minimal4, linked by
# its soname: no -dev package needed) keeps per-thread caches, where glibc's
# arenas made the SQLite writer thread spend about 18 % of its time in malloc
# growing and trimming its heap; bench/gateway measured 10 % less engine CPU
# per execution (docs/bench.md).  MALLOC=glibc opts out; sanitizer builds
# always use the sanitizer's allocator.
ifeq ($(SANITIZER),)
  MALLOC ?= tcmalloc
endif
ifeq ($(MALLOC),tcmalloc)
  MALLOC_LIBS := -l:libtcmalloc_minimal.so.4
endif

SRC := $(sort $(wildcard src/*/*.c))
OBJ := $(SRC:%.c=$(BUILD)/%.o)
LIB := $(BUILD)/libidemflow.a

PROGS := $(BUILD)/idemflow $(BUILD)/idemflow-mockpay
UNIT_SRC := $(sort $(wildcard tests/unit/test_*.c))
UNIT_BIN := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/%)
BENCH_SRC := $(sort $(wildcard bench/*.c))
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

.PHONY: build all deps test-deps run test check unit integration bench fuzz format format-check clean
# `make`: missing packages first (a fresh Debian has no compiler), then a
# second make that sees them (pkg-config runs when a make starts).
build:
	@scripts/deps.sh build
	@$(MAKE) --no-print-directory all
all: $(LIB) $(PROGS) $(UNIT_BIN) $(BENCH_BIN)

deps:
	@scripts/deps.sh build
test-deps:
	@scripts/deps.sh test

# V=1 shows full command lines.
ifeq ($(V),1)
  Q :=
  say = @true
else
  Q := @
  say = @echo "  $(1)"
endif

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(call say,CC    $<)
	$(Q)$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(LIB): $(OBJ)
	@mkdir -p $(dir $@)
	$(call say,AR    $@)
	$(Q)rm -f $@ && ar rcs $@ $^

$(BUILD)/idemflow: $(BUILD)/programs/idemflow/main.o $(LIB)
	$(call say,LINK  $@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(MALLOC_LIBS)
MOCKPAY_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(sort $(wildcard programs/mockpay/*.c)))
$(BUILD)/idemflow-mockpay: $(MOCKPAY_OBJ) $(LIB)
	$(call say,LINK  $@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)
-include $(MOCKPAY_OBJ:.o=.d)

$(BUILD)/tests/%: $(BUILD)/tests/unit/%.o $(LIB)
	@mkdir -p $(dir $@)
	$(call say,LINK  $@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) -lcmocka
# The benchmarks' clients (gwcalls is the engine's own gateway client) get
# the engine's allocator too.
$(BUILD)/bench/%: $(BUILD)/bench/%.o $(LIB)
	@mkdir -p $(dir $@)
	$(call say,LINK  $@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(MALLOC_LIBS)

# `make run`: packages, build, then the engine on ./idemflow.db with examples/ loaded.
run:
	@scripts/deps.sh build
	@$(MAKE) --no-print-directory $(BUILD)/idemflow $(BUILD)/idemflow-mockpay
	@scripts/run.sh $(BUILD)/idemflow $(BUILD)/idemflow-mockpay

# `make test`: packages, build, unit + integration + conformance, one summary line.
test:
	@scripts/deps.sh test
	@$(MAKE) --no-print-directory -j$$(nproc) all
	@BUILD=$(BUILD) SANITIZER=$(SANITIZER) tests/run.sh

bench:
	@scripts/deps.sh bench
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) bench/run.sh

FUZZ_SRC := $(sort $(wildcard fuzz/fuzz_*.c))
fuzz:
	@scripts/deps.sh test
	@$(MAKE) --no-print-directory BUILD=build-fuzz SANITIZER=address,undefined \
	    EXTRA_CFLAGS=-fsanitize=fuzzer-no-link build-fuzz/libidemflow.a
	@mkdir -p build-fuzz/fuzz
	@for f in $(FUZZ_SRC); do n=$$(basename $$f .c); \
	  echo "  FUZZ $$n"; \
	  clang -std=c11 -D_GNU_SOURCE -g -O1 -Isrc $(PKG_CFLAGS) -fsanitize=fuzzer,address,undefined \
	    $$f build-fuzz/libidemflow.a -o build-fuzz/fuzz/$$n $(LDLIBS) || exit 1; done

format:
	clang-format -i $(SRC) $(wildcard src/*/*.h) $(wildcard programs/*/*.c) $(UNIT_SRC) $(BENCH_SRC) $(FUZZ_SRC)
format-check:
	clang-format --dry-run -Werror $(SRC) $(wildcard src/*/*.h) $(wildcard programs/*/*.c) $(UNIT_SRC)

clean:
	rm -rf build build-*

.SECONDARY:

-include $(wildcard $(BUILD)/*/*.d $(BUILD)/*/*/*.d $(BUILD)/*/*/*/*.d)
