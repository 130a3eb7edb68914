"""What the PyTorch reference benches share: ACE-Step 1.5's VAE config and the
process's memory figures."""
import resource

# AutoencoderOobleck as ACE-Step 1.5's vae/config.json sets it.
VAE_CONFIG = dict(encoder_hidden_size=128, downsampling_ratios=[2, 4, 4, 6, 10], channel_multiples=[1, 2, 4, 8, 16],
                  decoder_channels=128, decoder_input_channels=64, audio_channels=2, sampling_rate=48000)


def rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
