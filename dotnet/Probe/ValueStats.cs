// A parameter's value_norm and checksum in one pass over its data, for tensors whose values sit in
// host memory (TorchSharp: a contiguous CPU tensor, its data at THSTensor_data). The checksum is the
// one optcheck/pytorch/probe.py records: the sum of the values' bit patterns, wrapping, over int32
// words for 4-byte elements and over int64 words for 8-byte elements, so two snapshots have equal
// checksums when the values did not move (docs/dotnet.md, "Values").
using System;
using System.Runtime.InteropServices;
using OptCheck.Contract;

namespace OptCheck.Probe
{
    internal static class ValueStats
    {
        const int Chunk = 16384;
        [ThreadStatic] static float[] f32;
        [ThreadStatic] static int[] i32;
        [ThreadStatic] static double[] f64;
        [ThreadStatic] static long[] i64;

        static IntPtr At(IntPtr data, long byteOffset) { return new IntPtr(data.ToInt64() + byteOffset); }

        /// <summary>L2 norm (accumulated in double) and int32 bit-pattern sum of <paramref name="n"/> float32
        /// values at <paramref name="data"/>, read chunk by chunk (each chunk copied once into a reused buffer).</summary>
        /// <exception cref="ArgumentException">data is zero while n &gt; 0.</exception>
        public static void Float32(IntPtr data, long n, out double norm, out long checksum)
        {
            if (n > 0 && data == IntPtr.Zero) throw new ArgumentException("ValueStats.Float32: no data");
            if (f32 == null) { f32 = new float[Chunk]; i32 = new int[Chunk]; }
            float[] fb = f32;  // locals: a [ThreadStatic] field read in the loop costs ~20 ns per value
            int[] ib = i32;
            double ss = 0;
            int sum = 0;
            for (long off = 0; off < n; off += Chunk) {
                int k = (int)Math.Min(Chunk, n - off);
                Marshal.Copy(At(data, off * 4), fb, 0, k);
                Buffer.BlockCopy(fb, 0, ib, 0, k * 4);
                unchecked {
                    for (int j = 0; j < k; j++) { double v = fb[j]; ss += v * v; sum += ib[j]; }
                }
            }
            norm = Math.Sqrt(ss);
            checksum = sum;
        }

        /// <summary>L2 norm and int64 bit-pattern sum of <paramref name="n"/> float64 values at <paramref name="data"/>.</summary>
        /// <exception cref="ArgumentException">data is zero while n &gt; 0.</exception>
        public static void Float64(IntPtr data, long n, out double norm, out long checksum)
        {
            if (n > 0 && data == IntPtr.Zero) throw new ArgumentException("ValueStats.Float64: no data");
            if (f64 == null) { f64 = new double[Chunk]; i64 = new long[Chunk]; }
            double[] fb = f64;
            long[] ib = i64;
            double ss = 0;
            long sum = 0;
            for (long off = 0; off < n; off += Chunk) {
                int k = (int)Math.Min(Chunk, n - off);
                Marshal.Copy(At(data, off * 8), fb, 0, k);
                Buffer.BlockCopy(fb, 0, ib, 0, k * 8);
                unchecked {
                    for (int j = 0; j < k; j++) { double v = fb[j]; ss += v * v; sum += ib[j]; }
                }
            }
            norm = Math.Sqrt(ss);
            checksum = sum;
        }

        /// <summary>The int32-word bit-pattern sum of <paramref name="bytes"/> bytes (a multiple of 4; 16-bit
        /// tensors with an even element count, as optcheck/pytorch/probe.py sums them).</summary>
        /// <exception cref="ArgumentException">bytes is not a multiple of 4, or data is zero.</exception>
        public static long Words32(IntPtr data, long bytes)
        {
            if (bytes % 4 != 0) throw new ArgumentException("ValueStats.Words32: " + bytes + " bytes is not a whole number of int32 words");
            if (bytes > 0 && data == IntPtr.Zero) throw new ArgumentException("ValueStats.Words32: no data");
            if (i32 == null) { f32 = new float[Chunk]; i32 = new int[Chunk]; }
            int[] ib = i32;
            int sum = 0;
            long n = bytes / 4;
            for (long off = 0; off < n; off += Chunk) {
                int k = (int)Math.Min(Chunk, n - off);
                Marshal.Copy(At(data, off * 4), ib, 0, k);
                unchecked { for (int j = 0; j < k; j++) sum += ib[j]; }
            }
            return sum;
        }
    }
}
