// The TorchSharp training loop the Python worker drives one call per step (OptCheck.Probe.Driver,
// dotnet/README.md): the same step as optcheck/pytorch/train.py — lr_at() schedule, zero_grad,
// forward, cross-entropy, backward, clip_grad_norm_ 1.0, AdamW.step() — with a DisposeScope per
// step, AdamW with nanoGPT's decay / no-decay groups and every option passed explicitly
// (TorchSharp's weight_decay default is 0, PyTorch's 0.01: docs/torchsharp.md), the lifecycle events
// eval / checkpoint / resume and the TorchSharp faults of optcheck/scenarios.py.
//
// It is a ModuleTrainer, the class a user's own trainer derives from: the built-in soak runs the user
// path, the GuardedOptimizer included (its zero_grad() and step() run the in-step check).
//
// The param groups are lazy LINQ over model.named_parameters(), as `optim.AdamW(model.parameters())`
// is in TorchSharp user code: step() and zero_grad() re-walk the model's current parameters, so a
// parameter replaced after the optimizer exists is looked up in _state and throws
// KeyNotFoundException (the seed-003 crash). Batches come from Python (the same BatchSchedule
// offsets over the same token file as the PyTorch worker).
using System;
using System.Collections.Generic;
using System.Globalization;
using System.IO;
using System.Linq;
using System.Reflection;
using OptCheck.Contract;
using OptCheck.Probe;
using TorchSharp;
using TorchSharp.Modules;
using static TorchSharp.torch;

namespace OptCheck.Worker
{
    public sealed class GptTrainer : ModuleTrainer
    {
        /// <summary>The full type name the Python worker is given (SoakConfig.extra["dotnet_trainer"]).</summary>
        public const string TypeName = "OptCheck.Worker.GptTrainer";

        static readonly string[] Faults = { "module-to-after-optimizer", "param-replaced", "param-registered-late", "eager-param-list",
                                            "state-leak", "no-dispose-scope" };

        // SoakConfig values (optcheck/config.py), set by Setup.
        long seed = 1337, steps = 20000, warmupSteps = 100;
        double lr = 1e-3, minLr = 1e-4, weightDecay = 0.1, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, gradClip = 1.0;
        int threads = 1;
        string workDir = ".", sameInit, device = "cpu";  // --device: cpu, cuda or cuda:N (docs/gpu.md)
        GPTConfig config;

        long[] lastX = new long[0], lastY = new long[0];
        int lastB, lastT;
        bool lastIsHeldOut;
        string initSource = "TorchSharp init (seeded)";

        // memory faults (optcheck/scenarios.py): each step's loss kept, graph and all; the step run
        // without its DisposeScope
        readonly List<Tensor> keptLosses = new List<Tensor>();
        bool keepLosses, noDisposeScope;

        GPT gpt;
        AdamW adamw;

        /// <summary>The GPT (ModuleTrainer.Model is the same object).</summary>
        public GPT Gpt { get { return gpt; } }
        /// <summary>Its AdamW, unwrapped (ModuleTrainer.Optimizer is the guarded one Step calls).</summary>
        public AdamW AdamWOptimizer { get { return adamw; } }

        void Use(GPT model, AdamW optimizer)
        {
            gpt = model;
            adamw = optimizer;
            Model = model;
            Optimizer = optimizer;
        }

        public override string[] Scenarios { get { return (string[])Faults.Clone(); } }
        /// <summary>Where the initial weights came from ("--same-init DIR" or TorchSharp's own seeded init).</summary>
        public string InitSource { get { return initSource; } }

        // -- setup ---------------------------------------------------------------------------

        protected override void Setup(TrainerOptions o)
        {
            seed = o.Long("seed", seed);
            steps = o.Long("steps", steps);
            warmupSteps = o.Long("warmup_steps", warmupSteps);
            lr = o.Double("lr", lr);
            minLr = o.Double("min_lr", minLr);
            weightDecay = o.Double("weight_decay", weightDecay);
            beta1 = o.Double("beta1", beta1);
            beta2 = o.Double("beta2", beta2);
            eps = o.Double("eps", eps);
            gradClip = o.Double("grad_clip", gradClip);
            threads = (int)o.Long("threads", threads);
            double dropout = o.Double("dropout", 0.0);
            if (dropout != 0.0)
                throw new ArgumentException("dropout " + dropout.ToString(CultureInfo.InvariantCulture) +
                                            ": the TorchSharp GPT has no dropout; use 0 (the default, which keeps the two backends comparable)");
            string opt;
            if (o.TryGet("extra.optimizer", out opt) && opt.ToLowerInvariant() != "adamw")
                throw new ArgumentException("optimizer " + opt + ": the TorchSharp GPT trains with AdamW only (--optimizer adamw)");
            string wd;
            if (o.TryGet("work_dir", out wd)) workDir = wd;
            string dev;
            if (o.TryGet("device", out dev) && !string.IsNullOrEmpty(dev)) device = dev;
            config = new GPTConfig {
                BlockSize = o.Long("block_size", 64),
                // the corpus's vocabulary (the worker passes it as extra.corpus_vocab_size); vocab_size is
                // only SoakConfig's override for .bin data
                VocabSize = o.Long("extra.corpus_vocab_size", o.Long("vocab_size", 256)),
                NLayer = o.Long("n_layer", 2),
                NHead = o.Long("n_head", 2),
                NEmbd = o.Long("n_embd", 64),
            };
            string tie;
            if (o.TryGet("extra.tie", out tie)) config.Tie = tie;
            o.TryGet("extra.same_init", out sameInit);
            if (threads < 1) throw new ArgumentException("threads must be at least 1, got " + threads);

            torch.set_num_threads(threads);
            torch.manual_seed(seed);
            var model = new GPT(config);
            if (sameInit != null) LoadInit(model, sameInit);
            model = OnDevice(model);
            Use(model, BuildOptimizer(model));
        }

        /// <summary>The model moved to --device (initialised on the CPU, as gpt.py's: the same weights
        /// everywhere); batches follow the model. A device this TorchSharp cannot open (TorchSharp-cpu,
        /// no CUDA device) is bad input (exit 2).</summary>
        GPT OnDevice(GPT model)
        {
            if (device == "cpu") return model;
            try {
                return model.to(device);
            } catch (Exception e) {
                throw new ArgumentException("--device " + device + ": TorchSharp cannot use it (" + e.Message + ")");
            }
        }

        /// <summary>AdamW over lazy decay (dim >= 2) / no-decay (dim < 2) groups of the model's
        /// trainable parameters, every option explicit (gpt.py configure_optimizers).</summary>
        AdamW BuildOptimizer(GPT model)
        {
            IEnumerable<Parameter> trainable = model.named_parameters().Select(np => np.parameter).Where(p => p.requires_grad);
            var groups = new AdamW.ParamGroup[] {
                new AdamW.ParamGroup(trainable.Where(p => p.dim() >= 2), lr, beta1, beta2, eps, weightDecay, false, false),
                new AdamW.ParamGroup(trainable.Where(p => p.dim() < 2), lr, beta1, beta2, eps, 0.0, false, false),
            };
            return torch.optim.AdamW(groups, lr, beta1, beta2, eps, weightDecay, false, false);
        }

        /// <summary>Copy initial weights exported by optcheck/pytorch/export_init.py into the model
        /// (InitManifest: DIR/manifest.txt + raw little-endian float32 files). Every model parameter
        /// must be there with its shape (a tied lm_head.weight may be absent: it is wte.weight's tensor).</summary>
        /// <exception cref="ArgumentException">missing manifest, parameter or file; a shape or dtype that differs.</exception>
        public void LoadInit(GPT model, string dir)
        {
            Dictionary<string, InitEntry> entries = InitManifest.Read(dir);
            using (torch.no_grad()) {
                foreach (var np in model.named_parameters()) {
                    InitEntry e;
                    if (!entries.TryGetValue(np.name, out e)) {
                        if (np.name == "lm_head.weight" && model.lm_head != null) continue;
                        throw new ArgumentException("--same-init " + dir + ": no initial value for parameter " + np.name);
                    }
                    long[] have = np.parameter.shape;
                    if (!e.Shape.SequenceEqual(have))
                        throw new ArgumentException("--same-init " + dir + ": " + np.name + " has shape [" + InitManifest.ShapeText(e.Shape) +
                                                    "] there, [" + InitManifest.ShapeText(have) + "] here");
                    float[] data = InitManifest.ReadFloats(dir, e);
                    // a DisposeScope, not using (Tensor t = ...): mcs compiles using's null check on a Tensor
                    // with TorchSharp's element-wise != (Tensor.ne(Scalar)), a NullReferenceException on
                    // TorchSharp >= 0.10x (docs/torchsharp.md, "Real TorchSharp here")
                    using (torch.NewDisposeScope()) np.parameter.copy_(torch.tensor(data).view(e.Shape));
                }
            }
            initSource = "--same-init " + dir;
        }

        // -- the step ------------------------------------------------------------------------

        /// <summary>optcheck.pytorch.train.lr_at: linear warm-up, then cosine decay to min_lr at steps.</summary>
        public double LrAt(long step)
        {
            if (step <= warmupSteps) return lr * step / Math.Max(1, warmupSteps);
            double frac = (double)(step - warmupSteps) / Math.Max(1, steps - warmupSteps);
            return minLr + 0.5 * (1 + Math.Cos(Math.PI * Math.Min(1.0, frac))) * (lr - minLr);
        }

        void Remember(long[] x, long[] y, int batch, int time, bool heldOut)
        {
            if (lastX.Length != x.Length) { lastX = new long[x.Length]; lastY = new long[y.Length]; }
            Array.Copy(x, lastX, x.Length);
            Array.Copy(y, lastY, y.Length);
            lastB = batch; lastT = time; lastIsHeldOut = heldOut;
        }

        public override double Step(long step, long[] inputs, long[] targets, int batch, int time)
        {
            if (!lastIsHeldOut || lastX.Length == 0) Remember(inputs, targets, batch, time, false);
            double lrNow = LrAt(step);
            foreach (var g in Optimizer.ParamGroups) g.LearningRate = lrNow;
            if (noDisposeScope) return StepBody(inputs, targets, batch, time);  // every temporary left for the GC
            using (DisposeScope scope = torch.NewDisposeScope()) {
                return StepBody(inputs, targets, batch, time);
            }
        }

        double StepBody(long[] inputs, long[] targets, int batch, int time)
        {
            Optimizer.zero_grad();
            Device device = gpt.TiedWeight().device;  // batches go where the model is (CPU or CUDA)
            Tensor x = torch.tensor(inputs, device: device).view(batch, time);
            Tensor y = torch.tensor(targets, device: device).view(batch, time);
            Tensor loss = GPT.Loss(gpt.call(x), y);
            loss.backward();
            if (gradClip > 0) torch.nn.utils.clip_grad_norm_(gpt.parameters(), gradClip);
            Optimizer.step();
            if (keepLosses) keptLosses.Add(loss.MoveToOuterDisposeScope());  // `losses.Add(loss)`: survives the scope
            return loss.to(ScalarType.Float64).item<double>();
        }

        public override double EvalLoss(long[] inputs, long[] targets, int batch, int time)
        {
            Remember(inputs, targets, batch, time, true);
            return Forward(inputs, targets, batch, time);
        }

        /// <summary>Eval mode, no_grad forward, training mode restored; the loss.</summary>
        double Forward(long[] inputs, long[] targets, int batch, int time)
        {
            bool wasTraining = gpt.training;
            gpt.eval();
            try {
                using (torch.no_grad())
                using (DisposeScope scope = torch.NewDisposeScope()) {
                    Device device = gpt.TiedWeight().device;
                    Tensor x = torch.tensor(inputs, device: device).view(batch, time);
                    Tensor y = torch.tensor(targets, device: device).view(batch, time);
                    return GPT.Loss(gpt.call(x), y).to(ScalarType.Float64).item<double>();
                }
            } finally {
                gpt.train(wasTraining);
            }
        }

        // -- faults (optcheck/scenarios.py) --------------------------------------------------

        public override string Inject(string name)
        {
            switch (name) {
            case "module-to-after-optimizer":
                gpt.to(ScalarType.Float64);
                return "model.to(ScalarType.Float64)";
            case "param-replaced": {
                Linear fc = gpt.h[0].mlp.c_fc;
                Parameter old = fc.get_parameter("weight");
                fc.weight = new Parameter(old.detach().clone(), true);
                return "model.h[0].mlp.c_fc.weight = new Parameter(weight.detach().clone())";
            }
            case "param-registered-late":
                gpt.ln_f.AddGain();
                return "model.ln_f.register_parameter(\"gain\", new Parameter(torch.ones(n_embd)))";
            case "eager-param-list":
                // what `optim.AdamW(model.parameters().ToList())` would hold: the groups' members
                // materialised now, then the dtype change that rebuilds the plain Parameter fields.
                foreach (var g in adamw.ParamGroups) {
                    ParamGroup pg = (ParamGroup)g;
                    pg.Parameters = pg.Parameters.ToList();
                }
                gpt.to(ScalarType.Float64);
                return "optimizer groups from model.parameters().ToList(); model.to(ScalarType.Float64)";
            case "state-leak":
                keepLosses = true;
                return "losses.Add(loss) every step (the loss tensor, graph and all, never disposed)";
            case "no-dispose-scope":
                noDisposeScope = true;
                return "the training step run without `using (torch.NewDisposeScope())`: its temporaries wait for the GC";
            default:
                throw new ArgumentException("scenario '" + name + "' has no TorchSharp implementation (TorchSharp has: " +
                                            string.Join(", ", Faults) + ")");
            }
        }

        // -- lifecycle events ----------------------------------------------------------------

        string ModelPath { get { return Path.Combine(workDir, "checkpoint.model.bin"); } }
        string OptimizerPath { get { return Path.Combine(workDir, "checkpoint.optimizer.bin"); } }

        public override string Lifecycle(string kind)
        {
            switch (kind) {
            case "eval": {
                string loss = "no batch yet";
                if (lastX.Length > 0)
                    loss = "loss " + Forward(lastX, lastY, lastB, lastT).ToString("R", CultureInfo.InvariantCulture) +
                           (lastIsHeldOut ? " on the last held-out batch" : " on the last training batch");
                Parameter p = gpt.parameters().First();
                Device device = p.device;
                ScalarType dtype = p.dtype;
                string where = TensorFacts.Device(p) + ", " + DTypes.Normalize(dtype.ToString());
                gpt.to(device, dtype);  // the no-op round trip evaluation code does (docs/torchsharp.md: not a no-op on 0.99.6)
                return "model.eval(); no_grad forward (" + loss + "); model.train(); model.to(" + where + ")";
            }
            case "checkpoint":
                Directory.CreateDirectory(workDir);
                gpt.save(ModelPath);
                adamw.save_state_dict(OptimizerPath);
                gpt.load(ModelPath);
                adamw.load_state_dict(OptimizerPath);
                return "model.save + optimizer.save_state_dict to " + workDir + "; model.load + optimizer.load_state_dict back";
            case "resume": {
                string also = "";
                if (!File.Exists(ModelPath) || !File.Exists(OptimizerPath)) {
                    Lifecycle("checkpoint");  // resume before any checkpoint: checkpoint now, as a job would have
                    also = " (checkpointed first: there was none)";
                }
                GPT oldModel = gpt;
                AdamW oldOptimizer = adamw;
                var model = new GPT(config);
                model.load(ModelPath);
                model = OnDevice(model);
                AdamW optimizer = BuildOptimizer(model);
                optimizer.load_state_dict(OptimizerPath);
                Use(model, optimizer);
                oldOptimizer.Dispose();
                oldModel.Dispose();
                return "new GPT + AdamW, model.load + optimizer.load_state_dict from the last checkpoint" + also;
            }
            default:
                throw new ArgumentException("unknown lifecycle event '" + kind + "' (eval, checkpoint, resume)");
            }
        }

        // -- versions ------------------------------------------------------------------------

        /// <summary>TorchSharp's package version, from its assembly (informational version without the +commit).</summary>
        public static string TorchSharpVersion()
        {
            return TensorFacts.TorchSharpVersion();
        }

        public override string[] Versions {
            get {
                return new string[] {
                    "torchsharp=" + TorchSharpVersion(),
                    "libtorch=" + torch.__version__,
                    "dotnet=" + Environment.Version,
                };
            }
        }
    }
}
