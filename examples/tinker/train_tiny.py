"""A Tinker loop against ftq (docs/tinker.md): the official `tinker` SDK with ftq's address and an ftq token
of the `tml-` form. A LoRA on the catalog's tiny model learns two sentences, then samples from its saved
sampler weights. Run it beside `make up`:

    TINKER_API_KEY=tml-... python examples/tinker/train_tiny.py   # FTQ_URL, else http://127.0.0.1:8000
"""

from __future__ import annotations

import os

import tinker
from tinker import types

TEXTS = ["alice has a red ball and bob has a blue cup.", "count from one: one, two, three, four, five."]


def main() -> None:
    url = os.environ.get("FTQ_URL", "http://127.0.0.1:8000")
    # With auth off (make up's default) any tml- key is accepted; with FTQ_API_TOKENS, one of them.
    key = os.environ.get("TINKER_API_KEY", "tml-local")
    service = tinker.ServiceClient(base_url=url, api_key=key)
    training = service.create_lora_training_client(base_model="ftq-tiny", rank=8, seed=0).result()
    tokenizer = training.get_tokenizer()
    data = []
    for text in TEXTS:
        ids = tokenizer.encode(text)
        n = len(ids) - 1
        data.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(ids[:-1]),
                loss_fn_inputs={
                    "target_tokens": types.TensorData(data=ids[1:], dtype="int64", shape=[n]),
                    "weights": types.TensorData(data=[1.0] * n, dtype="float32", shape=[n]),
                },
            )
        )
    tokens = sum(len(d.model_input.to_ints()) for d in data)
    for step in range(5):
        fwd = training.forward_backward(data, "cross_entropy")
        opt = training.optim_step(types.AdamParams(learning_rate=1e-2))
        loss = fwd.result().metrics["loss:sum"]
        opt.result()
        print(f"step {step}: mean NLL {loss / tokens:.3f}")
    path = training.save_weights_for_sampler("final").result().path
    sampler = service.create_sampling_client(model_path=path).result()
    prompt = types.ModelInput.from_ints(tokenizer.encode("alice has"))
    params = types.SamplingParams(max_tokens=8, temperature=0.0)
    answer = sampler.sample(prompt=prompt, num_samples=1, sampling_params=params).result()
    print("sample:", repr(tokenizer.decode(answer.sequences[0].tokens)))
    print("saved:", path)
    service.close("success").result()


if __name__ == "__main__":
    main()
