"""diffusers' task: a tiny conditional UNet predicts noise for one step; its attention is the best the image has."""

import torch
from diffusers import DDPMScheduler, UNet2DConditionModel

unet = UNet2DConditionModel(
    sample_size=8,
    in_channels=4,
    out_channels=4,
    layers_per_block=1,
    block_out_channels=(32, 64),
    down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
    cross_attention_dim=32,
    attention_head_dim=8,
    norm_num_groups=8,
)
scheduler = DDPMScheduler(num_train_timesteps=10)
latents, text = torch.randn(1, 4, 8, 8), torch.randn(1, 3, 32)
t = torch.tensor([5])
noise = torch.randn_like(latents)
pred = unet(scheduler.add_noise(latents, noise, t), t, encoder_hidden_states=text).sample
torch.nn.functional.mse_loss(pred, noise).backward()
print("diffusers: UNet step", tuple(pred.shape))
