"""The examples each command's help ends with (``textgen COMMAND --help``): runnable as shown, 80 columns wide."""

TRAIN = """
**Examples**

    textgen train 2600-0.txt --device cpu --download --time-budget 12m
    textgen train --resume                            # continue the latest run
    textgen train --resume --time-budget +30m         # train it 30 minutes more
    textgen train my_book.txt --units 768 --layers 2  # your own text
    textgen train books/ --max-vocab 120              # a directory's .txt files
    textgen train 'books/*.txt' a.txt --accumulate 4  # a glob and a file
    textgen train 2600-0.txt --optimizer adamw --weight-decay 0.05 --epochs 5
    textgen train my_book.txt --layers 2 --layer-norm --weight-drop 0.1
    textgen train my_book.txt --from-study my_book    # tune's best recipe
    textgen train other.txt --config checkpoints/studies/my_book/best.json
    textgen train poems.txt --init-from base:en --time-budget 2m  # the base
    textgen train my_book.txt --init-from 2600-0 --time-budget 10m  # fine-tune
    textgen train tiny.txt --init-from 2600-0 --freeze embedding --run tiny
    TF_CONFIG='{...}' textgen train books/ --strategy multiworker --run lib

A name that is not a file here is looked up in ./corpora, then in $TEXTGEN_CORPUS_PATH; --download fetches
a Project Gutenberg book (2600-0.txt: War and Peace) found nowhere into ./corpora.
Ctrl-C stops at a clean point and saves; `--resume` continues from there.
"""

DISTILL = """
**Examples**

    textgen distill --teacher 2600-0 --units 128 --time-budget 20m
    textgen distill --teacher 2600-0 --units 256 --layers 2 --run wp-2x256

The student is an ordinary run: sample, evaluate, export it; `textgen train --resume --run NAME` continues it.
"""

PRUNE = """
**Examples**

    textgen prune --source 2600-0 --sparsity 0.8 --time-budget 40m --ramp 0.4
    textgen export --run 2600-0-pruned80 --format litert --quantize int8

The pruned run is an ordinary run: sample, evaluate, export it; `textgen train --resume --run NAME` continues it.
Its zeros compress: gzip the exported model.
"""

SAMPLE = """
**Examples**

    textgen sample --temp 0.8                  # the latest run (none: base:en)
    textgen sample --run base:en --prime "It was"   # the base model
    textgen sample --run 2600-0 --prime "Prince Andrew" --num 8 --seed 7
    textgen sample --temp 0 --top-k 5 --top-p 0.9 --json
    textgen sample --temp 0 --frequency-penalty 0.01 --logit-bias '\\n=-100'
    textgen sample --prime-file ch1.txt --adapt   # adapt, then continue
    cat notes.txt | textgen sample --prime-file -
"""

REPL = """
**Examples**

    textgen repl                               # the latest run (none: base:en)
    textgen repl --run 2600-0 --temp 0.5 --length 300
    textgen repl --prime-file notes.txt        # a file's text, the first prompt

In the REPL, type :help for commands (:temp, :len, :topk, :topp, :freq, :presence, :bias, :seed, :num, :context,
:settings, :quit).
"""

SERVE = """
**Examples**

    textgen serve                                 # latest run (or base:en): http://127.0.0.1:8000
    textgen serve --run 2600-0 --port 9000
    textgen serve --model exports/2600-0-litert   # an export, without TensorFlow
    TEXTGEN_API_KEY=secret textgen serve --host 0.0.0.0

Clients speak OpenAI's completions API (POST /v1/completions, "max_tokens" in characters); /metrics is
Prometheus text. SIGTERM or Ctrl-C drains: for --drain seconds new requests get 503 and running streams go on,
then they end and the server exits. Each request leaves a line on stderr (--log-format json: a JSON object).
"""

EVALUATE = """
**Examples**

    textgen evaluate                         # the latest run, its test split
    textgen evaluate --run 2600-0 --split val --json
    textgen evaluate other_book.txt          # any text file
    textgen evaluate --run big --streams 64  # compare runs of any --batch-size
    textgen evaluate --dynamic               # static and dynamic side by side
    textgen evaluate --dynamic --retune      # tune its settings again
"""

EXPORT = """
**Examples**

    textgen export --format litert --quantize int8     # for phones and browsers
    textgen export --run 2600-0 --format savedmodel -o serving/wp/1
    textgen sample --model exports/2600-0-litert-int8  # no TensorFlow needed

The directory holds the network and textgen.json (vocabulary, model config); nothing else from the run is needed.
"""

TUNE = """
**Examples**

    textgen tune 2600-0.txt --download --time-budget 2h --trial-budget 10m
    textgen tune 2600-0.txt --time-budget 3h         # continue it: 1 more hour
    textgen tune --show                              # the latest study's trials
    textgen tune my_book.txt --units 256             # search all but --units
    textgen train 2600-0.txt --from-study 2600-0 --time-budget 2h  # its best
    textgen tune my_book.txt --init-from 2600-0 --study ft --trial-budget 5m
    textgen train my_book.txt --from-study ft --time-budget 30m  # fine-tunes

The first trial is textgen train's default recipe; trials behind the others at the same training time are
stopped early. Each trial is a run in CHECKPOINT_DIR/studies/STUDY/. Ctrl-C saves the running trial; the same
command continues the study, resuming that trial.
"""

RUNS = """
**Examples**

    textgen runs                                     # the runs in ./checkpoints
    textgen runs --checkpoint-dir /data/runs --json
"""
