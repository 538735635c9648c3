// A user's own TorchSharp code, for the real-TorchSharp tier of the tests (tests/torchsharp_real/):
// compiled with mcs against TorchSharp 0.107.0's own TorchSharp.dll with optcheck's sources, run on
// CoreCLR against a real libtorch (docs/torchsharp.md, "Real TorchSharp here").
//
// TinyLm: a small transformer language model of the user's own (token + position embeddings, one
// pre-LayerNorm block with causal scaled-dot-product attention and a GELU MLP, a learned plain
// Parameter field, a head), TorchSharp's own modules throughout.
// BugTrainer: its ModuleTrainer, with one identity bug planted INSIDE its own Step, before its own
// optimizer.step() / zero_grad() (Bugs.Plant): optcheck must name it at that step, phase in-step,
// before TorchSharp throws.
// ZooTrainer: the same model under any built-in TorchSharp optimizer and the recipes users write
// (param groups, named parameters, LR schedulers, clipping, a frozen embedding, save/load, eval
// switches, gradient accumulation), and libtorch's native LBFGS.
// C# 7 (mcs); every Tensor null check is ReferenceEquals; no `using (Tensor t = ...)` (mcs compiles its
// null check with TorchSharp's element-wise !=).
using System;
using System.Collections.Generic;
using System.Globalization;
using System.IO;
using System.Linq;
using OptCheck.Contract;
using TorchSharp;
using TorchSharp.Modules;
using static TorchSharp.torch;

namespace OptCheckReal
{
    /// <summary>forward(idx (B, T) int64) -> logits (B, T, vocab).</summary>
    public sealed class TinyLm : nn.Module<Tensor, Tensor>
    {
        // field names are the parameter names (RegisterComponents)
        public Embedding tok;
        public Embedding pos;
        public LayerNorm ln_1;
        public Linear q, k, v, proj;
        public LayerNorm ln_2;
        public Linear fc, fc_out;
        public LayerNorm ln_f;
        public Linear head;
        public Parameter scale;   // a learned plain Parameter field

        public TinyLm(long vocab, long width, long block) : base("TinyLm")
        {
            tok = nn.Embedding(vocab, width);
            pos = nn.Embedding(block, width);
            ln_1 = nn.LayerNorm(width);
            q = nn.Linear(width, width, true);
            // no key bias: softmax over a row is shift-invariant, so a key bias gets a zero gradient (~1e-9 of
            // float noise) and never moves under SGD, which OC205 would rightly call a parameter that learns nothing
            k = nn.Linear(width, width, false);
            v = nn.Linear(width, width, true);
            proj = nn.Linear(width, width, true);
            ln_2 = nn.LayerNorm(width);
            fc = nn.Linear(width, 2 * width, true);
            fc_out = nn.Linear(2 * width, width, true);
            ln_f = nn.LayerNorm(width);
            head = nn.Linear(width, vocab, true);
            scale = new Parameter(torch.ones(width), true);
            RegisterComponents();
        }

        public override Tensor forward(Tensor idx)
        {
            long T = idx.shape[1];
            Tensor x = tok.call(idx).add(pos.call(torch.arange(0L, T, dtype: ScalarType.Int64, device: idx.device)));
            Tensor h = ln_1.call(x);
            x = x.add(proj.call(nn.functional.scaled_dot_product_attention(q.call(h), k.call(h), v.call(h), is_casual: true)));
            x = x.add(fc_out.call(nn.functional.gelu(fc.call(ln_2.call(x)))));
            return head.call(ln_f.call(x).mul(scale));
        }

        /// <summary>Mean cross-entropy on (B, T) inputs against (B, T) targets, on the model's device and dtype.</summary>
        public Tensor Loss(long[] inputs, long[] targets, int batch, int time)
        {
            Device device = scale.device;
            Tensor logits = call(torch.tensor(inputs, device: device).view(batch, time));
            return nn.functional.cross_entropy(logits.view(-1, logits.shape[2]), torch.tensor(targets, device: device).view(-1));
        }

        /// <summary>The registered Parameter object of <paramref name="name"/> (never a module's getter).</summary>
        public Parameter Named(string name)
        {
            return named_parameters().First(np => np.name == name).parameter;
        }
    }

    /// <summary>The identity bugs a user plants inside their own step.</summary>
    public static class Bugs
    {
        public static readonly string[] Names = { "retyped", "param-replaced", "registered-late", "eager-to-float64", "nan-weight" };

        /// <summary>Planted before the user's zero_grad() (its call throws); the rest between backward() and step().</summary>
        public static bool BeforeZeroGrad(string bug) { return bug == "eager-to-float64"; }

        /// <summary>An optimizer over a materialised parameter list (what eager-to-float64 needs).</summary>
        public static bool Eager(string bug) { return bug == "eager-to-float64"; }

        public static string Plant(TinyLm m, string bug)
        {
            switch (bug) {
            case "retyped":
            case "eager-to-float64":
                m.to(ScalarType.Float64);
                return "model.to(ScalarType.Float64)";
            case "param-replaced":
                m.head.weight = new Parameter(m.Named("head.weight").detach().clone(), true);
                return "model.head.weight = new Parameter(...)";
            case "registered-late":
                m.register_parameter("late_bias", new Parameter(torch.zeros(m.Named("head.bias").shape[0]), true));
                return "model.register_parameter(\"late_bias\", ...)";
            case "nan-weight":
                using (torch.no_grad()) m.Named("head.weight").view(-1)[0].fill_(double.NaN);
                return "head.weight[0, 0] = NaN";
            default:
                throw new ArgumentException("no bug '" + bug + "' (" + string.Join(", ", Names) + ")");
            }
        }
    }

    /// <summary>TinyLm + AdamW, a bug planted inside Step at extra.bug_at (extra.bug: Bugs.Names; none: clean).</summary>
    public sealed class BugTrainer : ModuleTrainer
    {
        TinyLm model;
        string bug;
        long bugAt;

        protected override void Setup(TrainerOptions o)
        {
            torch.manual_seed(o.Long("seed", 1337));
            torch.set_num_threads((int)o.Long("threads", 1));
            bug = o.String("extra.bug", "");
            bugAt = o.Long("extra.bug_at", -1);
            model = new TinyLm(o.Long("extra.corpus_vocab_size", o.Long("vocab_size", 256)), o.Long("n_embd", 32),
                               o.Long("block_size", 32));
            Model = model;
            double lr = o.Double("lr", 1e-3);
            Optimizer = Bugs.Eager(bug) ? torch.optim.AdamW(model.parameters().ToList(), lr)   // a materialised list
                                        : torch.optim.AdamW(model.parameters(), lr);
        }

        public override double Step(long step, long[] inputs, long[] targets, int batch, int time)
        {
            using (torch.NewDisposeScope()) {
                bool plant = step == bugAt && bug.Length > 0;
                if (plant && Bugs.BeforeZeroGrad(bug)) Bugs.Plant(model, bug);
                Optimizer.zero_grad();
                Tensor loss = model.Loss(inputs, targets, batch, time);
                loss.backward();
                if (plant && !Bugs.BeforeZeroGrad(bug)) Bugs.Plant(model, bug);
                Optimizer.step();
                return loss.to(ScalarType.Float64).item<double>();
            }
        }
    }

    /// <summary>TinyLm under extra.optim (Zoo.Names, or lbfgs) with extra.recipe (Zoo.Recipes, or none);
    /// extra.rotate = K: a new optimizer every K steps, through all of Zoo.Names (one soak for the whole zoo).</summary>
    public sealed class ZooTrainer : ModuleTrainer
    {
        TinyLm model;
        string name, recipe, workDir;
        double lr;
        long rotate;
        optim.lr_scheduler.LRScheduler scheduler;
        int rotation;

        protected override void Setup(TrainerOptions o)
        {
            torch.manual_seed(o.Long("seed", 1337));
            torch.set_num_threads((int)o.Long("threads", 1));
            name = o.String("extra.optim", "adamw");
            recipe = o.String("extra.recipe", "");
            rotate = o.Long("extra.rotate", 0);
            workDir = o.String("work_dir", Path.GetTempPath());
            lr = o.Double("lr", 1e-3);
            model = new TinyLm(o.Long("extra.corpus_vocab_size", o.Long("vocab_size", 256)), o.Long("n_embd", 32),
                               o.Long("block_size", 32));
            Model = model;
            if (recipe == "frozen-embedding") model.Named("pos.weight").requires_grad = false;
            if (rotate > 0) name = Zoo.Names[0];
            Optimizer = Zoo.Build(name, recipe, model, lr);
            long steps = o.Long("steps", 1000);
            if (recipe == "steplr") scheduler = optim.lr_scheduler.StepLR(Optimizer, 20, 0.5);
            else if (recipe == "cosine") scheduler = optim.lr_scheduler.CosineAnnealingLR(Optimizer, steps, lr / 10);
            else if (recipe == "onecycle") scheduler = optim.lr_scheduler.OneCycleLR(Optimizer, 10 * lr, total_steps: (int)steps + 1);
        }

        public override string[] Scenarios { get { return new[] { "module-to-after-optimizer" }; } }

        public override double Step(long step, long[] inputs, long[] targets, int batch, int time)
        {
            if (rotate > 0 && step > 1 && (step - 1) % rotate == 0) {   // the next optimizer of the zoo, same model
                optim.Optimizer old = UnguardedOptimizer;
                rotation = (rotation + 1) % Zoo.Names.Length;
                name = Zoo.Names[rotation];
                Optimizer = Zoo.Build(name, recipe, model, lr);
                old.Dispose();
            }
            if (recipe == "save-load" && step % 25 == 0) SaveLoad();
            using (torch.NewDisposeScope()) {
                if (name == "lbfgs") return LbfgsStep(inputs, targets, batch, time);
                bool accumulate = recipe == "accumulation";
                if (!accumulate || step % 2 == 1) Optimizer.zero_grad();
                Tensor loss = model.Loss(inputs, targets, batch, time);
                (accumulate ? loss.div(2.0) : loss).backward();
                if (recipe == "clip") torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5);
                if (!accumulate || step % 2 == 0) Optimizer.step();
                if (!ReferenceEquals(scheduler, null)) scheduler.step();
                double value = loss.to(ScalarType.Float64).item<double>();
                if (recipe == "eval" && step % 10 == 0) Evaluate(inputs, targets, batch, time);
                return value;
            }
        }

        double LbfgsStep(long[] inputs, long[] targets, int batch, int time)
        {
            double first = double.NaN;
            Optimizer.step(() => {
                Optimizer.zero_grad();
                Tensor loss = model.Loss(inputs, targets, batch, time);
                loss.backward();
                if (double.IsNaN(first)) first = loss.to(ScalarType.Float64).item<double>();
                return loss;
            });
            return first;
        }

        void Evaluate(long[] inputs, long[] targets, int batch, int time)
        {
            model.eval();
            using (torch.no_grad()) model.Loss(inputs, targets, batch, time);
            model.train();
        }

        void SaveLoad()
        {
            Directory.CreateDirectory(workDir);
            string m = Path.Combine(workDir, "zoo.model.bin"), s = Path.Combine(workDir, "zoo.optimizer.bin");
            var helper = (OptimizerHelper)UnguardedOptimizer;
            model.save(m);
            helper.save_state_dict(s);
            model.load(m);
            helper.load_state_dict(s);
        }

        public override double EvalLoss(long[] inputs, long[] targets, int batch, int time)
        {
            model.eval();
            try {
                using (torch.no_grad())
                using (torch.NewDisposeScope()) {
                    return model.Loss(inputs, targets, batch, time).to(ScalarType.Float64).item<double>();
                }
            } finally {
                model.train();
            }
        }
    }

    /// <summary>TorchSharp's built-in optimizers by name, over the model's parameters as a recipe passes them.</summary>
    public static class Zoo
    {
        public static readonly string[] Names = {
            "sgd", "sgd-nesterov", "adam", "adamw", "adamw-amsgrad", "rmsprop-centered", "adagrad", "adadelta",
            "adamax", "nadam", "radam", "asgd", "rprop" };
        public static readonly string[] Recipes = {
            "two-groups", "named", "steplr", "cosine", "onecycle", "clip", "frozen-embedding", "save-load", "eval",
            "accumulation" };

        public static optim.Optimizer Build(string name, string recipe, TinyLm model, double lr)
        {
            // lazy, like optim.X(model.parameters()): the optimizer re-walks the model at every call
            IEnumerable<Parameter> ps = recipe == "frozen-embedding" ? model.parameters().Where(p => p.requires_grad)
                                                                     : model.parameters();
            if (recipe == "two-groups") {
                if (name != "adamw") throw new ArgumentException("two-groups is an AdamW recipe");
                return torch.optim.AdamW(new[] {
                    new AdamW.ParamGroup(model.parameters().Where(p => p.dim() >= 2), lr, 0.9, 0.95, 1e-8, 0.1, false, false),
                    new AdamW.ParamGroup(model.parameters().Where(p => p.dim() < 2), lr, 0.9, 0.95, 1e-8, 0.0, false, false),
                }, lr);
            }
            if (recipe == "named") {
                if (name != "adamw") throw new ArgumentException("named is an AdamW recipe");
                return torch.optim.AdamW(model.named_parameters(), lr);
            }
            switch (name) {
            case "sgd": return torch.optim.SGD(ps, 10 * lr);
            case "sgd-nesterov": return torch.optim.SGD(ps, 10 * lr, 0.9, 0.0, 0.0, true);
            case "adam": return torch.optim.Adam(ps, lr);
            case "adamw": return torch.optim.AdamW(ps, lr);
            case "adamw-amsgrad": return torch.optim.AdamW(ps, lr, 0.9, 0.999, 1e-8, 0.01, true);
            case "rmsprop-centered": return torch.optim.RMSProp(ps, lr, 0.99, 1e-8, 0.0, 0.0, true);
            case "adagrad": return torch.optim.Adagrad(ps, 10 * lr);
            case "adadelta": return torch.optim.Adadelta(ps, 1.0);
            case "adamax": return torch.optim.Adamax(ps, lr);
            case "nadam": return torch.optim.NAdam(ps, lr);
            case "radam": return torch.optim.RAdam(ps, lr);
            case "asgd": return torch.optim.ASGD(ps, 10 * lr);
            case "rprop": return torch.optim.Rprop(ps, lr);
            case "lbfgs": return torch.optim.LBFGS(ps, 0.05, 2);   // small steps: a stochastic batch each step, no line search
            default: throw new ArgumentException("no optimizer '" + name + "' (" + string.Join(", ", Names) + ", lbfgs)");
            }
        }
    }
}
