// Reads initial weights exported from PyTorch by optcheck/pytorch/export_init.py (for --same-init):
// DIR/manifest.txt, one line per tensor "name TAB dtype TAB d0,d1,... TAB file" ('#' lines are
// comments), each file the tensor's values as raw little-endian float32, row-major. Free of
// TorchSharp types, so the tests compile it with mcs and read a real export with it.
using System;
using System.Collections.Generic;
using System.Globalization;
using System.IO;
using System.Linq;

namespace OptCheck.Worker
{
    public sealed class InitEntry
    {
        public string Name, DType, File;
        public long[] Shape;
        public long Count { get { return Shape.Aggregate(1L, (a, b) => a * b); } }
    }

    public static class InitManifest
    {
        /// <summary>The entries of DIR/manifest.txt by name.</summary>
        /// <exception cref="ArgumentException">no manifest, a malformed line, a dtype other than float32.</exception>
        public static Dictionary<string, InitEntry> Read(string dir)
        {
            string manifest = Path.Combine(dir, "manifest.txt");
            if (!System.IO.File.Exists(manifest))
                throw new ArgumentException("--same-init " + dir + ": no manifest.txt (write it with `python -m optcheck.pytorch.export_init`)");
            var entries = new Dictionary<string, InitEntry>();
            foreach (string line in System.IO.File.ReadAllLines(manifest)) {
                if (line.Length == 0 || line[0] == '#') continue;
                string[] f = line.Split('\t');
                if (f.Length != 4) throw new ArgumentException("--same-init " + manifest + ": bad line '" + line + "'");
                if (f[1] != "float32") throw new ArgumentException("--same-init " + manifest + ": " + f[0] + " is " + f[1] + ", expected float32");
                long[] shape;
                try {
                    shape = f[2].Length == 0 ? new long[0] : f[2].Split(',').Select(s => long.Parse(s, CultureInfo.InvariantCulture)).ToArray();
                } catch (FormatException) {
                    throw new ArgumentException("--same-init " + manifest + ": bad shape '" + f[2] + "' for " + f[0]);
                }
                entries[f[0]] = new InitEntry { Name = f[0], DType = f[1], Shape = shape, File = f[3] };
            }
            return entries;
        }

        /// <summary>The entry's values.</summary>
        /// <exception cref="ArgumentException">the file is missing or not 4 bytes per element; a big-endian machine.</exception>
        public static float[] ReadFloats(string dir, InitEntry e)
        {
            if (!BitConverter.IsLittleEndian) throw new ArgumentException("--same-init: the float32 files are little-endian and this machine is not");
            string path = Path.Combine(dir, e.File);
            if (!System.IO.File.Exists(path)) throw new ArgumentException("--same-init " + dir + ": no file " + e.File + " for " + e.Name);
            byte[] bytes = System.IO.File.ReadAllBytes(path);
            if (bytes.LongLength != 4 * e.Count)
                throw new ArgumentException("--same-init " + dir + ": " + e.File + " has " + bytes.LongLength + " bytes, expected " + (4 * e.Count));
            var data = new float[e.Count];
            Buffer.BlockCopy(bytes, 0, data, 0, bytes.Length);
            return data;
        }

        public static string ShapeText(long[] shape)
        {
            return string.Join(",", shape.Select(x => x.ToString(CultureInfo.InvariantCulture)).ToArray());
        }
    }
}
