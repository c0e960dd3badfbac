"""mnist-train: a network learns to read handwritten digits; gradients flow backwards through the graph.

ggml's MNIST example, fully connected model, on the 8x8 handwritten digits scikit-learn ships
(1,797 of them, 64 pixels each). As the example does: a static context holds the weights and the
batch of images in a backend buffer, a compute context holds the forward graph, ggml_set_param
marks the four weight tensors as trainable, and ggml-opt does the rest. ggml_opt_init adds the
cross-entropy loss and builds two more graphs from the forward one: ggml_build_backward_expand
appends a gradient node for every tensor between the weights and the loss (named "grad for ..."),
then one OPT_STEP_ADAMW per weight updates it in place from its gradient and its two moments.

Step through the first training step: the forward nodes, the loss, each backward node filling
a gradient, the four AdamW updates. Then ggml_opt_epoch trains epoch after epoch (one step each
here), holding back 100 digits to validate on; the Training tab draws the curves, the accuracy
on 250 digits the network never saw, and some of them with what it read.
"""

import numpy as np

from engine.ggml import *  # noqa: F403 - ggml.h
from engine.ggml_alloc import *  # noqa: F403 - ggml-alloc.h
from engine.ggml_backend import *  # noqa: F403 - ggml-backend.h
from engine.ggml_opt import *  # noqa: F403 - ggml-opt.h
from engine.resources import load_digits

NINPUT, NHIDDEN, NCLASSES = 64, 32, 10
NTRAIN, NTEST = 1500, 250  # of the 1,797 digits, in a fixed shuffled order
NBATCH = 50  # images per batch: one optimizer step each
NVAL = 100  # the last digits of the training set, evaluated after each epoch
NEPOCH = 20


def load_data():
    """The digits as ggml-opt wants them: pixels 0..1, labels one-hot."""
    pixels, target = load_digits()
    order = np.random.default_rng(0).permutation(len(target))
    images = (pixels[order] / 16.0).astype(np.float32)
    labels = np.eye(NCLASSES, dtype=np.float32)[target[order]]
    return images, labels


class mnist_model:  # noqa: N801 - the example's struct
    backend = None
    sched = None
    ctx_static = None
    ctx_compute = None
    buf_static = None
    fc1_weight = fc1_bias = fc2_weight = fc2_bias = None
    images = None
    logits = None


def mnist_model_init(model: mnist_model, n_threads: int) -> None:
    """The backend, the scheduler, the weights (random, as mnist_model_init_random) and the
    images batch in a static context with a CPU buffer."""
    model.backend = ggml_backend_cpu_init()
    ggml_backend_cpu_set_n_threads(model.backend, n_threads)
    model.sched = ggml_backend_sched_new([model.backend], None, 1, GGML_DEFAULT_GRAPH_SIZE, False, True)

    model.ctx_static = ggml_init(ggml_init_params(mem_size=16 * ggml_tensor_overhead(), mem_buffer=None,
                                                  no_alloc=True))
    model.fc1_weight = ggml_new_tensor_2d(model.ctx_static, GGML_TYPE_F32, NINPUT, NHIDDEN)
    model.fc1_bias = ggml_new_tensor_1d(model.ctx_static, GGML_TYPE_F32, NHIDDEN)
    model.fc2_weight = ggml_new_tensor_2d(model.ctx_static, GGML_TYPE_F32, NHIDDEN, NCLASSES)
    model.fc2_bias = ggml_new_tensor_1d(model.ctx_static, GGML_TYPE_F32, NCLASSES)
    ggml_set_name(model.fc1_weight, "fc1.weight")
    ggml_set_name(model.fc1_bias, "fc1.bias")
    ggml_set_name(model.fc2_weight, "fc2.weight")
    ggml_set_name(model.fc2_bias, "fc2.bias")
    model.images = ggml_new_tensor_2d(model.ctx_static, GGML_TYPE_F32, NINPUT, NBATCH)
    ggml_set_name(model.images, "images")
    ggml_set_input(model.images)
    model.buf_static = ggml_backend_alloc_ctx_tensors(model.ctx_static, model.backend)

    rng = np.random.default_rng(42)  # the example draws from N(0, 0.01): so do we
    for t in (model.fc1_weight, model.fc1_bias, model.fc2_weight, model.fc2_bias):
        ggml_backend_tensor_set(t, rng.normal(0.0, 1e-2, ggml_nelements(t)).astype(np.float32), 0, ggml_nbytes(t))


def mnist_model_build(model: mnist_model) -> None:
    """The compute context and the forward graph's tensors; the weights become trainable."""
    model.ctx_compute = ggml_init(ggml_init_params(
        mem_size=GGML_DEFAULT_GRAPH_SIZE * ggml_tensor_overhead() + 3 * ggml_graph_overhead(),
        mem_buffer=None, no_alloc=True))
    ggml_set_param(model.fc1_weight)
    ggml_set_param(model.fc1_bias)
    ggml_set_param(model.fc2_weight)
    ggml_set_param(model.fc2_bias)
    ctx = model.ctx_compute
    fc1 = ggml_relu(ctx, ggml_add(ctx, ggml_mul_mat(ctx, model.fc1_weight, model.images), model.fc1_bias))
    model.logits = ggml_add(ctx, ggml_mul_mat(ctx, model.fc2_weight, fc1), model.fc2_bias)
    ggml_set_name(model.logits, "logits")


def mnist_dataset(images_all, labels_all, first: int, n: int, ndata_shard: int):
    """n digits from `first` on as a ggml-opt dataset."""
    dataset = ggml_opt_dataset_init(GGML_TYPE_F32, GGML_TYPE_F32, NINPUT, NCLASSES, n, ndata_shard)
    ggml_backend_tensor_set(ggml_opt_dataset_data(dataset), images_all[first:first + n], 0, n * NINPUT * 4)
    ggml_backend_tensor_set(ggml_opt_dataset_labels(dataset), labels_all[first:first + n], 0, n * NCLASSES * 4)
    return dataset


def mnist_model_eval(model: mnist_model, dataset):
    """A forward pass per batch of the dataset (idata_split 0: no training), as the example's."""
    params = ggml_opt_default_params(model.sched, GGML_OPT_LOSS_TYPE_CROSS_ENTROPY)
    params.ctx_compute = model.ctx_compute
    params.inputs = model.images
    params.outputs = model.logits
    params.build_type = GGML_OPT_BUILD_TYPE_FORWARD
    opt_ctx = ggml_opt_init(params)
    result = ggml_opt_result_init()
    ggml_opt_epoch(opt_ctx, dataset, None, result, 0, None, None)
    ggml_opt_free(opt_ctx)
    return result


def fit(n_threads: int = 2, nepoch: int = NEPOCH) -> tuple[float, float]:
    """mnist-train.cpp's way, for `ggml-lens train`: ggml_opt_fit with ggml's progress bar on
    stderr, then the accuracy on the held-out digits."""
    images_all, labels_all = load_data()
    model = mnist_model()
    mnist_model_init(model, n_threads)
    mnist_model_build(model)
    dataset = mnist_dataset(images_all, labels_all, 0, NTRAIN, 10)
    ggml_opt_fit(model.sched, model.ctx_compute, model.images, model.logits, dataset,
                 GGML_OPT_LOSS_TYPE_CROSS_ENTROPY, GGML_OPT_OPTIMIZER_TYPE_ADAMW, ggml_opt_get_default_optimizer_params,
                 nepoch, NBATCH, NVAL / NTRAIN, False)
    test = mnist_dataset(images_all, labels_all, NTRAIN, NTEST, 1)
    return ggml_opt_result_accuracy(mnist_model_eval(model, test))


def run(n_threads: int = 2, nepoch: int = NEPOCH) -> dict:
    images_all, labels_all = load_data()
    model = mnist_model()
    mnist_model_init(model, n_threads)
    mnist_model_build(model)
    dataset = mnist_dataset(images_all, labels_all, 0, NTRAIN, 10)

    # ggml_opt_init: the loss, the backward graph, the optimizer steps
    params = ggml_opt_default_params(model.sched, GGML_OPT_LOSS_TYPE_CROSS_ENTROPY)
    params.ctx_compute = model.ctx_compute
    params.inputs = model.images
    params.outputs = model.logits
    opt_ctx = ggml_opt_init(params)
    ggml_opt_dataset_shuffle(opt_ctx, dataset, -1)

    # one training step, node by node: forward, loss, backward, AdamW
    result = ggml_opt_result_init()
    ggml_opt_alloc(opt_ctx, True)
    ggml_opt_dataset_get_batch(dataset, model.images, ggml_opt_labels(opt_ctx), 0)
    ggml_opt_eval(opt_ctx, result)
    first_loss, _ = ggml_opt_result_loss(result)

    # then whole epochs: shuffle the training part, a step per batch, validate on the rest
    history = []
    result_train = ggml_opt_result_init()
    result_val = ggml_opt_result_init()
    for epoch in range(nepoch):
        ggml_opt_dataset_shuffle(opt_ctx, dataset, NTRAIN - NVAL)
        ggml_opt_result_reset(result_train)
        ggml_opt_result_reset(result_val)
        ggml_opt_epoch(opt_ctx, dataset, result_train, result_val, NTRAIN - NVAL, None, None)
        history.append([*ggml_opt_result_loss(result_train), *ggml_opt_result_accuracy(result_train),
                        *ggml_opt_result_loss(result_val), *ggml_opt_result_accuracy(result_val)])
    ggml_opt_free(opt_ctx)

    # the digits it never saw
    test = mnist_dataset(images_all, labels_all, NTRAIN, NTEST, 1)
    result_test = mnist_model_eval(model, test)
    return {"first_loss": first_loss,
            "history": history,  # per epoch: train loss, ±, accuracy, ±, validation loss, ±, accuracy, ±
            "test_accuracy": list(ggml_opt_result_accuracy(result_test)),
            "test_pred": ggml_opt_result_pred(result_test),
            "test_labels": labels_all[NTRAIN:NTRAIN + NTEST].argmax(axis=1).tolist(),
            "test_images": images_all[NTRAIN:NTRAIN + 24].tolist()}  # the first few, to draw
