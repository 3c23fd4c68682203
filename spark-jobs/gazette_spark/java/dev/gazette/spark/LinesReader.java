package dev.gazette.spark;

import java.io.IOException;
import java.io.InputStream;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.util.Arrays;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.Platform;

/**
 * The lines of one slice, in order: each {@code \n} ends a line (a {@code \r} before it
 * is dropped, as Spark's text source does), a line runs on across contiguous pieces, and
 * what is left at the end of the slice or before a gap is a last line of its own; as the
 * Python source's lines decoder.
 */
final class LinesReader implements PartitionReader<InternalRow> {
    private static final byte NL = '\n';
    private static final byte CR = '\r';
    /** Eight bytes of a byte[] at once, for the newline search. */
    private static final VarHandle LONGS =
        MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);
    private static final long NLS = 0x0A0A0A0A0A0A0A0AL;
    private static final long ONES = 0x0101010101010101L;
    private static final long HIGHS = 0x8080808080808080L;
    private static final long BASE = Platform.BYTE_ARRAY_OFFSET;

    private final SlicePartition slice;
    private final int journalAt;
    private final int offsetAt;
    private final int valueAt;
    /** Each row is built here in Spark's UnsafeRow format, with the row's constant
     * part (null bits, the journal and where it is) written once: per line, the offset,
     * where the value is, and its bytes (System.arraycopy, not a native copy per
     * field). */
    private byte[] row;
    private final int fixed; // where a field's 8-byte slot is: fixed + 8 * ordinal
    private final int valueStart; // where the value's bytes go
    private final UnsafeRow unsafeRow;

    private byte[] buf = new byte[1 << 20];
    private long base; // the journal offset of buf[0]
    private int lineStart;
    private int scan;
    private int fill;
    private int next; // the next piece to open
    private Cursor cursor;
    private long lastEnd = -1;

    LinesReader(SlicePartition slice, StructType schema) {
        this.slice = slice;
        this.journalAt = index(schema, "journal");
        this.offsetAt = index(schema, "offset");
        this.valueAt = index(schema, "value");
        int fields = schema.fields().length;
        this.fixed = UnsafeRow.calculateBitSetWidthInBytes(fields);
        int variable = fixed + 8 * fields;
        byte[] journal = slice.journal.getBytes(StandardCharsets.UTF_8);
        this.valueStart = journalAt >= 0 ? variable + padded(journal.length) : variable;
        this.row = new byte[valueStart + 1024];
        if (journalAt >= 0) {
            Platform.putLong(row, BASE + fixed + 8L * journalAt,
                ((long) variable << 32) | journal.length);
            System.arraycopy(journal, 0, row, variable, journal.length);
        }
        this.unsafeRow = new UnsafeRow(fields);
        unsafeRow.pointTo(row, (int) BASE, valueStart);
    }

    private static int padded(int length) {
        return (length + 7) & ~7;
    }

    /** The first newline in b[from, to), or -1: eight bytes a step (the lowest byte
     * equal to '\n' shows as the lowest high bit of the SWAR zero-byte test). */
    private static int newline(byte[] b, int from, int to) {
        int i = from;
        for (; i + 8 <= to; i += 8) {
            long v = (long) LONGS.get(b, i) ^ NLS;
            long found = (v - ONES) & ~v & HIGHS;
            if (found != 0) {
                return i + (Long.numberOfTrailingZeros(found) >>> 3);
            }
        }
        for (; i < to; i++) {
            if (b[i] == NL) {
                return i;
            }
        }
        return -1;
    }

    private static int index(StructType schema, String name) {
        String[] names = schema.fieldNames();
        for (int i = 0; i < names.length; i++) {
            if (names[i].equals(name)) {
                return i;
            }
        }
        return -1;
    }

    @Override
    public boolean next() throws IOException {
        while (true) {
            int i = newline(buf, scan, fill);
            if (i >= 0) {
                emit(lineStart, i);
                lineStart = scan = i + 1;
                return true;
            }
            scan = fill;
            if (cursor != null && more()) {
                continue;
            }
            // The piece is done: its last line runs on into the next one if contiguous.
            Piece ahead = next < slice.pieces.length ? slice.pieces[next] : null;
            boolean contiguous = ahead != null && cursor != null && ahead.begin == lastEnd;
            if (!contiguous && lineStart < fill) {
                emit(lineStart, fill);
                lineStart = scan = fill;
                return true;
            }
            if (ahead == null) {
                return false;
            }
            openNext(contiguous);
        }
    }

    /** The row of the line buf[start, stop), written as Spark's own row format (no
     * object per line). */
    private void emit(int start, int stop) {
        int length = stop - start;
        if (length > 0 && buf[stop - 1] == CR) {
            length--;
        }
        if (offsetAt >= 0) {
            Platform.putLong(row, BASE + fixed + 8L * offsetAt, base + start);
        }
        if (valueAt < 0) {
            return;
        }
        int size = valueStart + padded(length);
        if (size > row.length) {
            row = Arrays.copyOf(row, Math.max(size, 2 * row.length));
        }
        Platform.putLong(row, BASE + fixed + 8L * valueAt, ((long) valueStart << 32) | length);
        if (length > 0) {
            Platform.putLong(row, BASE + size - 8, 0L); // (the padding after the value)
            System.arraycopy(buf, start, row, valueStart, length);
        }
        unsafeRow.pointTo(row, (int) BASE, size);
    }

    private void openNext(boolean contiguous) throws IOException {
        Piece piece = slice.pieces[next++];
        closeCursor();
        try {
            cursor = piece.cut() ? new CutCursor(piece) : new WholeCursor(piece);
        } catch (IOException | RuntimeException e) {
            throw piece.lost(slice.journal, e);
        }
        if (!contiguous) {
            lineStart = scan = fill = 0;
            base = cursor.start();
        }
        lastEnd = piece.end;
    }

    /** Read more of the current piece into the buffer; false once it has no more. */
    private boolean more() throws IOException {
        if (lineStart > 0) { // keep only the line under way, at the buffer's start
            System.arraycopy(buf, lineStart, buf, 0, fill - lineStart);
            base += lineStart;
            fill -= lineStart;
            scan -= lineStart;
            lineStart = 0;
        }
        if (fill == buf.length) {
            buf = java.util.Arrays.copyOf(buf, buf.length * 2);
        }
        int n;
        try {
            n = cursor.read(buf, fill, buf.length - fill);
        } catch (IOException | RuntimeException e) {
            throw cursor.piece.lost(slice.journal, e);
        }
        if (n < 0) {
            return false;
        }
        fill += n;
        return true;
    }

    @Override
    public InternalRow get() {
        return unsafeRow;
    }

    private void closeCursor() throws IOException {
        if (cursor != null) {
            cursor.in.close();
            cursor = null;
        }
    }

    @Override
    public void close() throws IOException {
        closeCursor();
    }

    /** The bytes of a piece that are its own, in order, with their journal offsets. */
    abstract static class Cursor {
        final Piece piece;
        InputStream in;
        long pos; // the journal offset of the next byte of `in`

        Cursor(Piece piece) {
            this.piece = piece;
        }

        /** The journal offset of the piece's first own byte. */
        abstract long start();

        /** Up to `len` own bytes into `b` at `off`; -1 when there are no more. */
        abstract int read(byte[] b, int off, int len) throws IOException;
    }

    /** A whole fragment's content from its start: its bytes before `begin` and after
     * `end` are read (not kept) so that its SHA-1 and length are checked at its end. */
    static final class WholeCursor extends Cursor {
        private final MessageDigest digest = Piece.sha1Digest();
        private boolean checked;

        WholeCursor(Piece piece) throws IOException {
            super(piece);
            in = piece.content();
            pos = piece.fragmentBegin;
        }

        @Override
        long start() {
            return piece.begin;
        }

        @Override
        int read(byte[] b, int off, int len) throws IOException {
            if (pos < piece.begin) {
                skipTo(piece.begin, b, off, len);
            }
            if (pos >= piece.end) {
                if (!checked) {
                    skipTo(Long.MAX_VALUE, b, off, len);
                    checked = true;
                }
                return -1;
            }
            int n = in.read(b, off, (int) Math.min(len, piece.end - pos));
            if (n < 0) {
                check();
                return -1; // (check() throws: the content ended before `end`)
            }
            digest.update(b, off, n);
            pos += n;
            return n;
        }

        /** Read (into the caller's free room, and hash) up to `to` or the content's end,
         * which is then checked. */
        private void skipTo(long to, byte[] b, int off, int len) throws IOException {
            while (pos < to) {
                int n = in.read(b, off, (int) Math.min(len, to - pos));
                if (n < 0) {
                    check();
                    return;
                }
                digest.update(b, off, n);
                pos += n;
            }
        }

        private void check() throws IOException {
            String wrong = piece.mismatch(digest, pos - piece.fragmentBegin);
            if (wrong != null) {
                throw new IOException(wrong);
            }
        }
    }

    /** A byte range of an uncompressed fragment (not checked: the audit job checks
     * fragments whole), its first line skipped with `headCut`, read through the end of
     * the line running over `end` with `tailCut`. */
    static final class CutCursor extends Cursor {
        private boolean done;
        private long first;

        CutCursor(Piece piece) throws IOException {
            super(piece);
            long from = piece.headCut ? piece.begin - 1 : piece.begin;
            in = new java.io.BufferedInputStream(piece.open(from - piece.fragmentBegin), 1 << 16);
            pos = from;
            if (piece.headCut) { // that line is the part before's
                int c;
                do {
                    c = in.read();
                    if (c >= 0) {
                        pos++;
                    }
                } while (c >= 0 && c != NL);
                done = c < 0 || pos >= piece.end;
            }
            first = pos;
        }

        @Override
        long start() {
            return first;
        }

        @Override
        int read(byte[] b, int off, int len) throws IOException {
            if (done) {
                return -1;
            }
            int want = piece.tailCut ? len : (int) Math.min(len, piece.end - pos);
            int n = in.read(b, off, want);
            if (n < 0) {
                done = true;
                return -1;
            }
            if (piece.tailCut && pos + n > piece.end - 1) {
                for (int i = off + (int) Math.max(0, piece.end - 1 - pos); i < off + n; i++) {
                    if (b[i] == NL) {
                        n = i - off + 1;
                        done = true;
                        break;
                    }
                }
            } else if (!piece.tailCut && pos + n >= piece.end) {
                done = true;
            }
            pos += n;
            return n;
        }
    }
}
