"""Built-in workloads: an MLP, a ResNet-style convnet and a GPT-style language model.

Each module has factories from tiny (CI) to real size (a GPU) and exposes ``autotune_dataset``,
a real ``Dataset`` whose per-sample CPU work (decompression, tokenisation, augmentation) is
adjustable, so that DataLoader workers change throughput as they do on real data.
"""
