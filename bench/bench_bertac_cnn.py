"""BERTAC CNN pretraining speed: building entity-masked pairs (seconds per 1,000 articles) and the GAN train step
(pairs per second), on the embedded real enwiki excerpt (106 articles).

- Pair building: the articles stream out of the XML dump into a Dataset, their wikitext is parsed into sentences with
  link spans, and one mention per sentence is replaced by [EM] (`training/data/bertac_pairs.py`), computed afresh (no
  `datasets` cache) once per `--num_proc` value, so the parallel map is compared side by side with one process.
- GAN step: Algorithm 1 on batches of those real pairs, as `GanTrainer` runs it: D and R's forward, backward and
  RMSProp update, then F's against the updated D. The frozen word table is the model's random init (speed does not
  depend on the vectors). The GAN runs in fp32 on any device (the GPU when there is one).

    python bench/bench_bertac_cnn.py [--size w123-f100] [--batch_size 256] [--steps 10] [--num_proc 1 2]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ["HF_DATASETS_CACHE"] = tempfile.mkdtemp(prefix="bench-bertac-")  # before datasets is imported
from common import write_result  # noqa: E402


def pair_building(num_procs: list[int]) -> tuple[dict, object]:
    import datasets

    from encoder_zoo.training.data import bertac_pairs as bertac_data

    datasets.disable_caching()
    datasets.disable_progress_bars()
    start = time.perf_counter()
    pages = bertac_data.load_article_pages()
    stream_seconds = time.perf_counter() - start
    result = {"articles": len(pages), "xml_stream_s_per_1000_articles": round(1000 * stream_seconds / len(pages), 2)}
    pairs = None
    for num_proc in num_procs:
        start = time.perf_counter()
        pairs = bertac_data.entity_masked_pairs(pages, seed=0, num_proc=num_proc if num_proc > 1 else None)
        seconds = time.perf_counter() - start
        result[f"pairs_s_per_1000_articles_num_proc_{num_proc}"] = round(1000 * seconds / len(pages), 2)
    result["pairs"] = len(pairs)
    if len(num_procs) > 1:
        first, last = num_procs[0], num_procs[-1]
        result[f"speedup_num_proc_{last}_vs_{first}"] = round(
            result[f"pairs_s_per_1000_articles_num_proc_{first}"]
            / result[f"pairs_s_per_1000_articles_num_proc_{last}"], 2
        )
    return result, pairs


def gan_steps(pairs, size: str, batch_size: int, steps: int) -> dict:
    import torch

    from encoder_zoo import models  # noqa: F401
    from encoder_zoo.models.bertac.configuration_bertac import BertacCnnConfig
    from encoder_zoo.models.bertac.modeling_bertac import BertacCnnForPreTraining
    from encoder_zoo.training.data import bertac_pairs as bertac_data
    from encoder_zoo.training.recipes.bertac import BERTAC_CNN_SIZES

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = bertac_data.train_word_tokenizer(pairs["sentence"], vocab_size=200_000)
    encoded = bertac_data.encode_pairs(pairs, tokenizer, max_words=128).shuffle(seed=0)
    collate = bertac_data.EntityPairCollator(tokenizer.pad_token_id)
    batches = [collate([encoded[i] for i in range(start, start + batch_size)])
               for start in range(0, len(encoded) - batch_size + 1, batch_size)]
    if not batches:
        raise SystemExit(f"--batch_size {batch_size} exceeds the {len(encoded)} pairs of the excerpt.")
    torch.manual_seed(0)
    config = BertacCnnConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **BERTAC_CNN_SIZES[size])
    model = BertacCnnForPreTraining(config).to(device).train()
    optimizer = torch.optim.RMSprop(model.parameters(), lr=2e-4)
    seconds, pairs_seen, words = 0.0, 0, 0
    for index in range(steps + 2):  # two warm-up steps
        batch = {k: v.to(device) for k, v in batches[index % len(batches)].items()}
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for gan_step in ("discriminator", "generator"):
            model(**batch, gan_step=gan_step).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if index >= 2:
            seconds += time.perf_counter() - start
            pairs_seen += batch["input_ids"].shape[0]
            words += int(batch["attention_mask"].sum() + batch["entity_attention_mask"].sum())
    return {
        "size": size, "batch_size": batch_size, "steps": steps, "device": str(device), "dtype": "float32",
        "word_vocabulary": len(tokenizer),
        "trained_params_M": round(sum(p.numel() for p in model.parameters()) / 1e6, 3),
        "gan_pairs_per_s": round(pairs_seen / seconds, 1), "gan_words_per_s": round(words / seconds, 1),
        "gan_ms_per_step": round(1000 * seconds / steps, 1),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="w123-f100", help="A bertac_cnn preset (tiny, w123-f100 ... w1234-f300).")
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--num_proc", type=int, nargs="+", default=[1, 2],
                        help="Processes of the parsing map, compared.")
    options = parser.parse_args()
    building, pairs = pair_building(options.num_proc)
    result = {**building, **gan_steps(pairs, options.size, options.batch_size, options.steps)}
    write_result(f"bertac_cnn_{options.size}_{result['device'].split(':')[0]}", result)


if __name__ == "__main__":
    main()
